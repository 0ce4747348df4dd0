// Package install tests the install bundle (`kustomize build config/default`, dist/install.yaml)
// against a real API server: every object is accepted, and the operator, running with exactly
// the bundle's RBAC (as its ServiceAccount), can drive a SequentialInbox to Ready and delete it.
package install

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/controller"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/internal/testenv/clustersim"
	"github.com/seqinbox/seqinbox/migrations"
)

const (
	namespace      = "seqinbox-system"
	serviceAccount = "system:serviceaccount:seqinbox-system:seqinbox-controller-manager"
	testImage      = "ghcr.io/seqinbox/seqinbox:install-test"
)

// buildBundle runs kustomize (pinned in hack/tools) on config/default, as `make build-installer` does.
func buildBundle(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	trackInputs(t, filepath.Join(root, "config"))
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-modfile=hack/tools/go.mod", "kustomize", "build", "config/default")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build config/default: %v", err)
	}
	var objs []*unstructured.Unstructured
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := decoder.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode the bundle: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}

// trackInputs reads every file under dir, so that `go test` caches this test's result only as long
// as the files that kustomize (a child process the cache cannot see) reads are unchanged.
func trackInputs(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		_, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		t.Fatalf("read the bundle's sources: %v", err)
	}
}

func TestInstallBundleIsAcceptedAndItsRBACRunsTheOperator(t *testing.T) {
	objs := buildBundle(t)
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets} // no CRDs: the bundle brings them
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	// Every object of the bundle is accepted with server-side apply, in the bundle's order.
	kinds := map[string]int{}
	for _, obj := range objs {
		err := admin.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner("install-test"), client.ForceOwnership)
		if err != nil {
			t.Fatalf("apply %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		kinds[obj.GetKind()]++
		if obj.GetKind() == "CustomResourceDefinition" {
			waitEstablished(t, admin, obj.GetName())
		}
		if ns := obj.GetNamespace(); ns != "" && ns != namespace {
			t.Errorf("%s %s is in namespace %s, want %s", obj.GetKind(), obj.GetName(), ns, namespace)
		}
	}
	for kind, want := range map[string]int{"Namespace": 1, "CustomResourceDefinition": 2, "ServiceAccount": 1, "ClusterRole": 5,
		"ClusterRoleBinding": 2, "Role": 1, "RoleBinding": 1, "Deployment": 1, "Service": 1} {
		if kinds[kind] != want {
			t.Errorf("the bundle has %d %s, want %d", kinds[kind], kind, want)
		}
	}

	// Least privilege: what the operator must not do is denied to its ServiceAccount.
	for _, check := range []struct {
		attrs   authorizationv1.ResourceAttributes
		allowed bool
	}{
		{authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "list", Resource: "secrets", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "watch", Resource: "secrets", Namespace: "shop"}, false},
		// The consumer state credentials: created once, never changed or deleted by the operator.
		{authorizationv1.ResourceAttributes{Verb: "create", Resource: "secrets", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Resource: "secrets", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "delete", Resource: "secrets", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "delete", Group: "apps", Resource: "deployments", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "inbox.seqinbox.dev", Resource: "sequentialinboxes", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Resource: "pods", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Group: "batch", Resource: "jobs", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "patch", Group: "batch", Resource: "jobs", Namespace: "shop"}, true}, // server-side apply
		{authorizationv1.ResourceAttributes{Verb: "watch", Group: "inbox.seqinbox.dev", Resource: "sequentialinboxactions", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "patch", Group: "inbox.seqinbox.dev", Resource: "sequentialinboxactions", Subresource: "status", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "inbox.seqinbox.dev", Resource: "sequentialinboxactions", Subresource: "finalizers", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "create", Group: "inbox.seqinbox.dev", Resource: "sequentialinboxactions", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "inbox.seqinbox.dev", Resource: "sequentialinboxactions", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: namespace}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "shop"}, false},
	} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: serviceAccount, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace},
			ResourceAttributes: &check.attrs}}
		if err := admin.Create(t.Context(), review); err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != check.allowed {
			t.Errorf("the operator may %s %s/%s in %s: %v, want %v", check.attrs.Verb, check.attrs.Group, check.attrs.Resource,
				check.attrs.Namespace, review.Status.Allowed, check.allowed)
		}
	}

	// The operator, as its ServiceAccount with leader election, drives an inbox to Ready.
	metricsURL := runOperatorAs(t, cfg, scheme, admin)
	scrapeOnlyWithTheMetricsReaderRole(t, cfg, admin, metricsURL)
	seeds := testenv.Kafka(t, 1, "orders")
	must(t, admin.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}))
	inspectorRoleGrantsExecInItsNamespaceOnly(t, admin)
	must(t, admin.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "shop"},
		StringData: map[string]string{"url": "postgres://inbox@db.example:5432/orders"}}))
	in := &v1alpha1.SequentialInbox{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop"},
		Spec: v1alpha1.SequentialInboxSpec{
			Kafka:    v1alpha1.KafkaSpec{BootstrapServers: seeds, Topics: []string{"orders"}, ConsumerGroup: "orders"},
			Database: v1alpha1.DatabaseSpec{URLSecretRef: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "db"}, Key: "url"}},
			Sink:     v1alpha1.SinkSpec{URL: "http://orders.shop.svc:8080/events"},
			Sequences: []v1alpha1.SequenceSpec{{Name: "order", Retention: v1alpha1.Duration{Duration: time.Hour}, Messages: []v1alpha1.MessageSpec{
				{Type: "OrderCreated"},
				{Type: "OrderPaid", ReleaseCondition: &v1alpha1.ReleaseCondition{Predecessor: "OrderCreated"}},
			}}},
		},
	}
	must(t, admin.Create(t.Context(), in))
	eventually(t, "the inbox is Ready", func() (bool, error) {
		err := admin.Get(t.Context(), client.ObjectKeyFromObject(in), in)
		return meta.IsStatusConditionTrue(in.Status.Conditions, v1alpha1.ConditionReady), err
	})
	eventually(t, "the operator's Events are recorded", func() (bool, error) {
		var events eventsv1.EventList
		err := admin.List(t.Context(), &events, client.InNamespace("shop"))
		for _, e := range events.Items {
			if e.Regarding.Name == "orders" && e.ReportingController == "seqinbox-operator" && e.Reason == "ConsumersReady" {
				return true, nil
			}
		}
		return false, err
	})
	must(t, admin.Delete(t.Context(), in))
	eventually(t, "the inbox is deleted", func() (bool, error) {
		err := admin.Get(t.Context(), client.ObjectKeyFromObject(in), in)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// runOperatorAs starts the operator's manager impersonating the bundle's ServiceAccount, with
// leader election in the operator's namespace, and clustersim's stand-ins writing as admin.
func runOperatorAs(t *testing.T, cfg *rest.Config, scheme *runtime.Scheme, admin client.Client) (metricsURL string) {
	t.Helper()
	metricsAddr := freeAddress(t)
	asOperator := rest.CopyConfig(cfg)
	asOperator.Impersonate = rest.ImpersonationConfig{UserName: serviceAccount,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
	mgr, err := ctrl.NewManager(asOperator, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controller.CacheOptions(),
		Metrics:                 controller.MetricsServerOptions(metricsAddr, true, false),
		HealthProbeBindAddress:  "0",
		LeaderElection:          true,
		LeaderElectionID:        "seqinbox-operator.inbox.seqinbox.dev",
		LeaderElectionNamespace: namespace,
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	must(t, controller.Setup(mgr, controller.Options{DefaultImage: testImage}))
	must(t, clustersim.Start(mgr, admin, func(*batchv1.Job) migrations.Report {
		return migrations.Report{SchemaVersion: migrations.Latest(), ClaimProtocol: inbox.ClaimProtocol, EngineVersion: "install-test"}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(ctx); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return "https://" + metricsAddr + "/metrics"
}

// freeAddress is a loopback address with a port that was free a moment ago.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrapeOnlyWithTheMetricsReaderRole scrapes the operator's metrics endpoint as Prometheus
// would: with the token of a ServiceAccount bound to the bundle's metrics-reader role it gets
// the metrics, over HTTP/1.1 only; without a token, or with one lacking the role, it does not.
func scrapeOnlyWithTheMetricsReaderRole(t *testing.T, cfg *rest.Config, admin client.Client, url string) {
	t.Helper()
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	must(t, admin.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}}))
	token := func(name string) string {
		must(t, admin.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "monitoring"}}))
		tr, err := clientset.CoreV1().ServiceAccounts("monitoring").CreateToken(t.Context(), name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, stranger := token("prometheus"), token("stranger")
	must(t, admin.Create(t.Context(), &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "prometheus-seqinbox-metrics"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "seqinbox-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: "monitoring"}}}))
	httpClient := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}}, //nolint:gosec // the endpoint's certificate is self-signed
		ForceAttemptHTTP2: true,
	}}
	scrape := func(token string) (int, string, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return 0, "", err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Proto, string(body)
	}
	eventually(t, "the metrics endpoint answers the scraper", func() (bool, error) {
		status, _, _ := scrape(scraper)
		return status == http.StatusOK, nil
	})
	status, proto, body := scrape(scraper)
	if status != http.StatusOK || !strings.Contains(body, "controller_runtime_reconcile_total") {
		t.Errorf("scrape with the metrics-reader role = %d, want 200 with controller-runtime metrics", status)
	}
	if proto != "HTTP/1.1" {
		t.Errorf("metrics served over %s, want HTTP/1.1: HTTP/2 stays off", proto)
	}
	if status, _, _ := scrape(""); status != http.StatusUnauthorized {
		t.Errorf("scrape without a token = %d, want 401", status)
	}
	if status, _, _ := scrape(stranger); status != http.StatusForbidden {
		t.Errorf("scrape with a token lacking the metrics-reader role = %d, want 403", status)
	}
}

func waitEstablished(t *testing.T, c client.Client, name string) {
	t.Helper()
	eventually(t, "CRD "+name+" is established", func() (bool, error) {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &crd); err != nil {
			return false, err
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// eventually polls done (with a deadline) until it reports true.
func eventually(t *testing.T, what string, done func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := done()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute (last error: %v)", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// inspectorRoleGrantsExecInItsNamespaceOnly binds the bundle's inspector role in namespace shop to
// a user: there she may read the inboxes and pods and exec into them, as `kubectl seqinbox
// inspect` does, and nothing else, and in another namespace nothing.
func inspectorRoleGrantsExecInItsNamespaceOnly(t *testing.T, admin client.Client) {
	t.Helper()
	must(t, admin.Create(t.Context(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "inspectors", Namespace: "shop"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "seqinbox-sequentialinbox-inspector-role"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "alice"}}}))
	for _, check := range []struct {
		attrs   authorizationv1.ResourceAttributes
		allowed bool
	}{
		{authorizationv1.ResourceAttributes{Verb: "get", Group: "inbox.seqinbox.dev", Resource: "sequentialinboxes", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "create", Resource: "pods", Subresource: "exec", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "get", Resource: "pods", Subresource: "exec", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "delete", Resource: "pods", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Resource: "pods", Subresource: "exec", Namespace: "elsewhere"}, false},
	} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: &check.attrs}}
		if err := admin.Create(t.Context(), review); err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != check.allowed {
			t.Errorf("the inspector role lets alice %s %s %s/%s in %s: %v, want %v", check.attrs.Verb, check.attrs.Group, check.attrs.Resource,
				check.attrs.Subresource, check.attrs.Namespace, review.Status.Allowed, check.allowed)
		}
	}
}
