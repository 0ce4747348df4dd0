package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestTheExampleProducesEventsTheSampleInboxSequences runs the example of docs/producers.md
// against an in-process broker and decodes what it wrote as a consumer of the sample inbox does:
// every record is a sequenced message of order 42, its CloudEvent id the idempotence ID.
func TestTheExampleProducesEventsTheSampleInboxSequences(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := manifest.Load(filepath.Join(root, "config", "samples", "inbox_v1alpha1_sequentialinbox.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	set, errs := declaration.Compile(&inbox.Spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	decoder, err := decode.New(set)
	if err != nil {
		t.Fatal(err)
	}
	seeds := testenv.Kafka(t, 3, "orders")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := produce(ctx, seeds, "42"); err != nil {
		t.Fatalf("produce: %v", err)
	}
	records := testenv.ReadTopic(t, seeds, "orders")
	if len(records) != 2 {
		t.Fatalf("read %d records from orders, want 2", len(records))
	}
	for _, r := range records {
		rec, err := decoder.Decode(r, time.Now())
		if err != nil {
			t.Fatalf("the sample inbox refuses the example's %s: %v", rec.Type, err)
		}
		if !rec.Sequenced || rec.ContextID != "42" || rec.IdempotenceID != rec.Origin.MessageID {
			t.Errorf("%s: sequenced %v, context %q, idempotence ID %q; want sequenced in order 42 with the CloudEvent id %q",
				rec.Type, rec.Sequenced, rec.ContextID, rec.IdempotenceID, rec.Origin.MessageID)
		}
	}
}
