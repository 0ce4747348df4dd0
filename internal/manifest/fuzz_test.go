package manifest

import (
	"testing"

	"github.com/seqinbox/seqinbox/internal/declaration"
)

// FuzzParse feeds arbitrary documents to the manifest loader and the declaration compiler, as
// `seqinbox consume -f` does: neither may panic, whatever the file holds. Seeds are in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte(everythingSet))
	f.Fuzz(func(t *testing.T, doc []byte) {
		in, err := Parse(doc)
		if err != nil {
			return
		}
		_, _ = declaration.Compile(&in.Spec)
		_ = DeadLetterTopic(&in.Spec)
	})
}
