package demo

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/sequence"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// dbURL is the package's own database; the demo creates its temporary database on its server.
var dbURL string

func TestMain(m *testing.M) { os.Exit(testenv.RunWithDatabase(m, &dbURL)) }

// samplePath is the manifest `make demo` runs.
func samplePath(t testing.TB) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "config", "samples", "inbox_v1alpha1_sequentialinbox.yaml")
}

// sample loads and compiles the sample declaration.
func sample(t testing.TB) (*v1alpha1.SequentialInbox, *sequence.Set) {
	t.Helper()
	inbox, err := manifest.Load(samplePath(t))
	if err != nil {
		t.Fatal(err)
	}
	set, errs := declaration.Compile(&inbox.Spec)
	if len(errs) > 0 {
		t.Fatalf("the sample does not compile: %v", errs.ToAggregate())
	}
	return inbox, set
}
