package plugin

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// readArchive returns the files of a .tar.gz by their path below the archive's top directory.
func readArchive(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := os.Open(file)
	must(t, err)
	defer func() { _ = f.Close() }()
	gz, err := gzip.NewReader(f)
	must(t, err)
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		must(t, err)
		data, err := io.ReadAll(tr)
		must(t, err)
		_, rel, _ := strings.Cut(h.Name, "/")
		files[rel] = string(data)
	}
}

func TestReportHoldsTheInboxItsObjectsAndEventsAndNoSecretValue(t *testing.T) {
	ns := namespace(t, "report")
	const (
		password = "s3cr3t-pass"
		dbURL    = "postgres://inbox:" + password + "@db.example:5432/orders"
		token    = "tok-abcdefgh1234"
	)
	inbox := createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
	owner := []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "SequentialInbox", Name: inbox.Name, UID: inbox.UID}}
	must(t, k8s.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "order-inbox-database", Namespace: ns},
		StringData: map[string]string{"url": dbURL}}))
	must(t, k8s.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "order-inbox-consumer-state", Namespace: ns, OwnerReferences: owner},
		StringData: map[string]string{"token": token}}))
	consumerPod(t, inbox, "order-inbox-consumer-0", 0)
	consumerPod(t, inbox, "order-inbox-consumer-1", 1)
	// Where a Secret value can leak into what the report collects: a message, a ConfigMap, an annotation.
	inboxEvent(t, inbox, "leak", corev1.EventTypeWarning, "MigrationFailed", "connect "+dbURL+": refused; password "+password, time.Minute, 1)
	must(t, k8s.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "order-inbox-config", Namespace: ns, OwnerReferences: owner,
		Annotations: map[string]string{"note": "token " + token}}, Data: map[string]string{"engine.yaml": "sink: http://orders.shop.svc:8080/events\n"}}))
	must(t, k8s.Create(t.Context(), &v1alpha1.SequentialInboxAction{ObjectMeta: metav1.ObjectMeta{Name: "close-42", Namespace: ns},
		Spec: v1alpha1.SequentialInboxActionSpec{InboxName: "order-inbox", Action: v1alpha1.ActionClose,
			Instance: &v1alpha1.ActionInstanceTarget{Sequence: "order", ContextID: "42"}}}))

	file := filepath.Join(t.TempDir(), "report.tar.gz")
	r := plugin(t, testNow, "", "report", "order-inbox", "-n", ns, "--file", file)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "wrote "+file+": ") {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	files := readArchive(t, file)
	for name, data := range files {
		for _, secret := range []string{password, token} {
			if strings.Contains(data, secret) {
				t.Errorf("%s holds the Secret value %q:\n%s", name, secret, data)
			}
		}
	}
	checks := []struct{ file, has string }{
		{"README.txt", "Support report of SequentialInbox report/order-inbox"},
		{"status.txt", "SequentialInbox report/order-inbox  Ready: True (ConsumersReady)"},
		{"status.yaml", "name: order-inbox-consumer-1"},
		{"inbox.yaml", "kind: SequentialInbox"},
		{"actions.yaml", "name: close-42"},
		{"objects/pods.yaml", "name: order-inbox-consumer-1"},
		{"objects/configmaps.yaml", "token " + redacted},
		{"objects/secrets.yaml", "name: order-inbox-database"},
		{"objects/secrets.yaml", "name: order-inbox-consumer-state"},
		{"objects/secrets.yaml", redacted + " (" + strconv.Itoa(len(dbURL)) + " bytes)"},
		{"events.yaml", "connect " + redacted + ": refused;"},
		{"events.yaml", "password " + redacted},
		// No operator runs: what is missing is named, and the rest is written.
		{"README.txt", "- operator logs: no pod with label control-plane=controller-manager in namespace seqinbox-system"},
	}
	for _, c := range checks {
		if !strings.Contains(files[c.file], c.has) {
			t.Errorf("%s does not hold %q:\n%s", c.file, c.has, files[c.file])
		}
	}
	// envtest runs no kubelet: the API server answers a pod without a node with an empty log.
	for _, pod := range []string{"order-inbox-consumer-0", "order-inbox-consumer-1"} {
		if _, ok := files["logs/report/"+pod+"/consumer.log"]; !ok {
			t.Errorf("no log of %s in the archive", pod)
		}
	}
	if strings.Contains(files["inbox.yaml"], "managedFields") {
		t.Errorf("inbox.yaml keeps the managed fields")
	}
}
