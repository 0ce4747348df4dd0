package plugin

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// The exec path itself (streams and exit code of a command in a pod) needs a kubelet and runs in
// test/e2e; these tests prove what the API server alone decides: which pod, and the errors.

// clientsAs connects as kubectl would with the kubeconfig file path, in namespace ns.
func clientsAs(t *testing.T, path, ns string) *clients {
	t.Helper()
	e := &env{flags: genericclioptions.NewConfigFlags(true)}
	e.flags.KubeConfig, e.flags.Namespace = &path, &ns
	c, err := e.connect()
	must(t, err)
	return c
}

// readyPod creates a consumer pod of inbox that runs image with engine version, and sets its
// status to running, with the Ready condition ready.
func readyPod(t *testing.T, inbox *v1alpha1.SequentialInbox, name, image, version string, ready bool) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: inbox.Namespace,
			Labels:      map[string]string{"app.kubernetes.io/name": "seqinbox", "app.kubernetes.io/instance": inbox.Name, "app.kubernetes.io/component": "consumer"},
			Annotations: map[string]string{engineVersionAnnotation: version}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: consumerContainer, Image: image}}},
	}
	must(t, k8s.Create(t.Context(), pod))
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}
	must(t, k8s.Status().Update(t.Context(), pod))
}

// execute runs `seqinbox deadletters list` in a consumer pod of inbox through c.
func execute(t *testing.T, c *clients, inbox *v1alpha1.SequentialInbox) error {
	t.Helper()
	_, err := execInConsumer(t.Context(), c, inbox, podCommand{Args: []string{"deadletters", "list", "-f", podManifest}, Since: "v0.1.0"}, io.Discard, io.Discard)
	return err
}

func TestExecWithoutAReadyConsumerPodSaysHowToSeeWhy(t *testing.T) {
	ns := namespace(t, "exec-none-ready")
	inbox := createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
	readyPod(t, inbox, "order-inbox-consumer-0", "ghcr.io/seqinbox/seqinbox:v1.0.0", "v1.0.0", false)
	err := execute(t, clientsAs(t, kubeconfig, ns), inbox)
	if err == nil || !strings.Contains(err.Error(), "has no ready consumer pod (of 1)") || !strings.Contains(err.Error(), "kubectl seqinbox status order-inbox -n "+ns) {
		t.Fatalf("error %v, want no ready consumer pod (of 1) and the status command", err)
	}
}

func TestExecWithoutTheRightNamesCreateOnPodsExec(t *testing.T) {
	ns := namespace(t, "exec-forbidden")
	inbox := createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
	readyPod(t, inbox, "order-inbox-consumer-0", "ghcr.io/seqinbox/seqinbox:v1.0.0", "v1.0.0", true)
	// A user who may read the inbox and its pods, as `status` needs, but not exec into them.
	must(t, k8s.Create(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "viewer", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sequentialinboxes"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
	}}))
	must(t, k8s.Create(t.Context(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "viewer", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "viewer"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "viewer"}}}))
	user, err := testEnv.AddUser(envtest.User{Name: "viewer"}, testEnv.Config)
	must(t, err)
	data, err := user.KubeConfig()
	must(t, err)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	must(t, os.WriteFile(path, data, 0o600))

	err = execute(t, clientsAs(t, path, ns), inbox)
	if err == nil || !strings.Contains(err.Error(), "RBAC verb create on pods/exec in namespace "+ns) {
		t.Fatalf("error %v, want the missing RBAC verb create on pods/exec", err)
	}
	t.Logf("viewer: %v", err)

	// With create on pods/exec alone, the right kubectl's exec has always needed, the WebSocket's
	// GET is refused (verb get) and SPDY's POST passes the API server's check; the exec then fails
	// for want of a kubelet, and the error says so instead of blaming a right.
	must(t, k8s.Create(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "exec", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create"}},
	}}))
	must(t, k8s.Create(t.Context(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "exec", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "exec"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "viewer"}}}))
	err = execute(t, clientsAs(t, path, ns), inbox)
	t.Logf("with create on pods/exec: %v", err)
	if err == nil || strings.Contains(err.Error(), "RBAC") || !strings.Contains(err.Error(), "run `seqinbox deadletters list` in pod "+ns+"/order-inbox-consumer-0") ||
		!strings.Contains(err.Error(), "does not have a host assigned") {
		t.Fatalf("error with create on pods/exec %v, want the failed run named, no RBAC verb", err)
	}
}

func TestExecRefusesAnImageOlderThanTheCommand(t *testing.T) {
	ns := namespace(t, "exec-older")
	inbox := createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
	readyPod(t, inbox, "order-inbox-consumer-0", "registry.example/seqinbox:v0.0.9", "v0.0.9", true)
	err := execute(t, clientsAs(t, kubeconfig, ns), inbox)
	want := "runs image registry.example/seqinbox:v0.0.9 (seqinbox v0.0.9), which lacks `seqinbox deadletters list`: this needs an image of seqinbox v0.1.0 or later"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want %q", err, want)
	}
}

func TestNewestReadyPodIsChosen(t *testing.T) {
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(testNow.Add(d)) }
	pod := func(name string, created metav1.Time, phase corev1.PodPhase, ready corev1.ConditionStatus, container string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created},
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: container, Image: "img"}}},
			Status: corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}}
	}
	terminating := pod("terminating", at(3*time.Minute), corev1.PodRunning, corev1.ConditionTrue, consumerContainer)
	terminating.DeletionTimestamp = ptrTime(at(4 * time.Minute))
	for _, tc := range []struct {
		name string
		pods []corev1.Pod
		want string
	}{
		{"newest ready", []corev1.Pod{
			pod("old", at(0), corev1.PodRunning, corev1.ConditionTrue, consumerContainer),
			pod("new", at(time.Minute), corev1.PodRunning, corev1.ConditionTrue, consumerContainer),
			pod("newest-not-ready", at(2*time.Minute), corev1.PodRunning, corev1.ConditionFalse, consumerContainer),
			terminating,
		}, "new"},
		{"same second: by name", []corev1.Pod{
			pod("b", at(0), corev1.PodRunning, corev1.ConditionTrue, consumerContainer),
			pod("a", at(0), corev1.PodRunning, corev1.ConditionTrue, consumerContainer),
		}, "a"},
		{"none ready", []corev1.Pod{
			pod("pending", at(0), corev1.PodPending, corev1.ConditionFalse, consumerContainer),
			pod("other-container", at(0), corev1.PodRunning, corev1.ConditionTrue, "sidecar"),
			terminating,
		}, ""},
	} {
		got := ""
		if p := newestReady(tc.pods); p != nil {
			got = p.Name
		}
		if got != tc.want {
			t.Errorf("%s: chose %q, want %q", tc.name, got, tc.want)
		}
	}
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }

// The answers of a seqinbox binary that lacks a command or a flag (cobra's and cli.GroupCommand's
// words), and of one that has them and refuses a value.
func TestLacksCommandKnowsAnOlderBinarysAnswer(t *testing.T) {
	for stderr, want := range map[string]bool{
		`seqinbox: unknown command "inspect" for "seqinbox"` + "\nRun 'seqinbox --help' for usage.\n":                                      true,
		`seqinbox deadletters: unknown command "list" for "seqinbox deadletters"` + "\nRun 'seqinbox deadletters --help' for usage.\n":     true,
		"seqinbox deadletters list: unknown flag: --since\nRun 'seqinbox deadletters list --help' for usage.\n":                            true,
		`seqinbox deadletters list: --reason "Nope": no dead letter has this reason; use one of ListenerFailed` + "\nRun 'seqinbox ...'\n": false,
	} {
		if got := lacksCommand(stderr); got != want {
			t.Errorf("lacksCommand(%q) = %v, want %v", stderr, got, want)
		}
	}
}
