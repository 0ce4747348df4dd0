package plugin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// The tests run the plugin's command lines against a real kube-apiserver and etcd (envtest),
// reached through a kubeconfig file and --kubeconfig as a user's kubectl would.

var (
	testEnv *envtest.Environment
	// k8s is an uncached client with the rights of the cluster's administrator.
	k8s client.Client
	// kubeconfig is the file the command lines pass with --kubeconfig.
	kubeconfig string
)

func TestMain(m *testing.M) {
	os.Exit(runWithAPIServer(m))
}

func runWithAPIServer(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard()) // as main does
	env, err := testenv.APIServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		return 2
	}
	defer func() { _ = env.Stop() }()
	testEnv = env
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	data, err := user.KubeConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	dir, err := os.MkdirTemp("", "kubectl-seqinbox-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, data, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return m.Run()
}

// result is what one command line wrote and its exit code.
type result struct {
	stdout, stderr string
	code           int
}

// plugin runs one command line in process as main does, with stdin from in, the clock at now
// and --kubeconfig of the test's API server.
func plugin(t *testing.T, now time.Time, in string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	streams := genericiooptions.IOStreams{In: strings.NewReader(in), Out: &out, ErrOut: &errOut}
	root := newRootCommand(streams, func() time.Time { return now })
	// A completion request completes its last argument: the kubeconfig goes before it.
	args = slices.Insert(slices.Clone(args), min(len(args), 2), "--kubeconfig", kubeconfig)
	err := cli.Run(context.Background(), root, args, &out, &errOut)
	if err != nil {
		cli.PrintError(&errOut, err)
	}
	return result{out.String(), errOut.String(), cli.ExitCode(err)}
}

// namespace creates a namespace for one test.
func namespace(t *testing.T, name string) string {
	t.Helper()
	must(t, k8s.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// createInbox creates a valid inbox of one sequence, changed by edit, and sets its status to st.
func createInbox(t *testing.T, ns, name string, edit func(*v1alpha1.SequentialInbox), st *v1alpha1.SequentialInboxStatus) *v1alpha1.SequentialInbox {
	t.Helper()
	inbox := &v1alpha1.SequentialInbox{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.SequentialInboxSpec{
			Kafka: v1alpha1.KafkaSpec{BootstrapServers: []string{"kafka.example:9092"}, Topics: []string{"orders"}, ConsumerGroup: name},
			Database: v1alpha1.DatabaseSpec{URLSecretRef: corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: name + "-database"}, Key: "url"}},
			Sink:     v1alpha1.SinkSpec{URL: "http://orders.shop.svc:8080/events"},
			Replicas: ptr.To(int32(2)),
			Sequences: []v1alpha1.SequenceSpec{{Name: "order", Retention: v1alpha1.Duration{Duration: time.Hour},
				Messages: []v1alpha1.MessageSpec{
					{Type: "OrderCreated"},
					{Type: "OrderPaid", ReleaseCondition: &v1alpha1.ReleaseCondition{Predecessor: "OrderCreated"}},
				}}},
		},
	}
	if edit != nil {
		edit(inbox)
	}
	must(t, k8s.Create(t.Context(), inbox))
	if st != nil {
		inbox.Status = *st
		must(t, k8s.Status().Update(t.Context(), inbox))
	}
	return inbox
}
