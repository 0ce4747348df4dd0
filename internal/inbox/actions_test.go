package inbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
)

func (h *harness) runActions(wantDone int) *recordingDeadLetterer {
	h.t.Helper()
	dl := &recordingDeadLetterer{}
	n, err := h.engine.RunPendingActions(context.Background(), dl)
	if err != nil || n != wantDone {
		h.t.Fatalf("RunPendingActions = %d, %v; want %d actions", n, err, wantDone)
	}
	return dl
}

func (h *harness) pendingActions() int {
	h.t.Helper()
	return h.count(`SELECT (SELECT count(*) FROM sequenced_message WHERE idempotence_id LIKE $1 AND pending_action IS NOT NULL)
 + (SELECT count(*) FROM sequence_instance WHERE context_id LIKE $1 AND pending_action IS NOT NULL)`, h.prefix+"%")
}

func TestConsumeActionDeliversWaitingMessageThenReleasesItsDependents(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("B", "b1", "x"))
	h.process(h.rec("C", "c1", "x"))
	if err := RequestMessageAction(context.Background(), h.pool, "", "B", h.prefix+"b1", ActionConsume); err != nil {
		t.Fatal(err)
	}
	h.runActions(1)
	if got := h.listener.deliveredTypes(h.ctxID("x")); !slices.Equal(got, []string{"B", "C"}) {
		t.Fatalf("delivered %v, want B (consumed) then C (released)", got)
	}
	if b, c := h.states("B", "b1"), h.states("C", "c1"); !slices.Equal(b, []string{stateProcessed}) || !slices.Equal(c, []string{stateProcessed}) {
		t.Fatalf("B %v, C %v; want PROCESSED", b, c)
	}
	if s := h.instanceState("chain", "x"); s != "OPEN" {
		t.Fatalf("instance = %s, want OPEN (A never came)", s)
	}
	if n := h.pendingActions(); n != 0 {
		t.Fatalf("pending actions = %d, want 0", n)
	}
	h.runActions(0)
}

func TestConsumeActionRetriesAFailedBufferedMessageUnderItsClaim(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("B", "b1", "x"))
	h.listener.setBehaviour(func(_ context.Context, m Message) error {
		if m.QualifiedType == "B" {
			return errors.New("rejected")
		}
		return nil
	})
	h.process(h.rec("A", "a1", "x"))
	h.listener.setBehaviour(nil)
	if err := RequestMessageAction(context.Background(), h.pool, "", "B", h.prefix+"b1", ActionConsume); err != nil {
		t.Fatal(err)
	}
	h.runActions(1)
	if s, c := h.states("B", "b1"), h.claims("B", "b1"); !slices.Equal(s, []string{stateProcessed}) || c != 1 {
		t.Fatalf("B rows %v, claims %d; want PROCESSED with its claim back", s, c)
	}
	if got := h.listener.deliveredTypes(h.ctxID("x")); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("delivered %v, want [A B]", got)
	}
}

func TestExpireActionMarksProcessedWithoutDeliveryAndReleasesDependents(t *testing.T) {
	h := newHarness(t, chainSet())
	h.listener.setBehaviour(func(context.Context, Message) error { return errors.New("poison") })
	h.process(h.rec("A", "a1", "x"))
	h.listener.setBehaviour(nil)
	h.process(h.rec("B", "b1", "x"))
	callsBefore := h.listener.callCount()

	if err := RequestMessageAction(context.Background(), h.pool, "", "A", h.prefix+"a1", ActionExpire); err != nil {
		t.Fatal(err)
	}
	h.runActions(1)
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("A = %v, want PROCESSED", s)
	}
	if got := h.listener.deliveredTypes(h.ctxID("x")); !slices.Equal(got, []string{"B"}) {
		t.Fatalf("delivered %v, want only B: EXPIRE does not deliver A", got)
	}
	if n := h.listener.callCount() - callsBefore; n != 1 {
		t.Fatalf("listener calls during the action = %d, want 1 (B)", n)
	}
}

func TestConsumeAllDeliversEveryBufferedMessageIgnoringConditions(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("C", "c1", "x"))
	h.process(h.rec("B", "b1", "x"))
	if err := RequestInstanceAction(context.Background(), h.pool, "", "chain", h.ctxID("x"), ActionConsumeAll); err != nil {
		t.Fatal(err)
	}
	h.runActions(1)
	if got := h.listener.deliveredTypes(h.ctxID("x")); !slices.Equal(got, []string{"C", "B"}) {
		t.Fatalf("delivered %v, want [C B] (buffer order, conditions ignored)", got)
	}
	if n := h.count(`SELECT count(*) FROM sequenced_message WHERE idempotence_id LIKE $1 AND state = 'WAITING'`, h.prefix+"%"); n != 0 {
		t.Fatalf("WAITING messages = %d, want 0", n)
	}
	if s, n := h.instanceState("chain", "x"), h.pendingActions(); s != "OPEN" || n != 0 {
		t.Fatalf("instance %s with %d pending actions; want OPEN (A missing) and none", s, n)
	}
}

func TestCloseActionClosesWithoutDeliveringAndDeadLettersTheBuffered(t *testing.T) {
	h := newHarness(t, chainSet())
	b := h.rec("B", "b1", "x")
	h.process(b)
	if err := RequestInstanceAction(context.Background(), h.pool, "", "chain", h.ctxID("x"), ActionClose); err != nil {
		t.Fatal(err)
	}
	dl := h.runActions(1)
	if s := h.instanceState("chain", "x"); s != "CLOSED" {
		t.Fatalf("instance = %s, want CLOSED", s)
	}
	if n := h.listener.callCount(); n != 0 {
		t.Fatalf("listener calls = %d, want 0", n)
	}
	if s, c := h.states("B", "b1"), h.claims("B", "b1"); !slices.Equal(s, []string{stateFailed}) || c != 0 {
		t.Fatalf("B rows %v, claims %d; want FAILED without claim, so a re-publish can retry it", s, c)
	}
	if len(dl.letters) != 1 || dl.letters[0].msg.Record.IdempotenceID != b.IdempotenceID || string(dl.letters[0].msg.Record.Value) != string(b.Value) {
		t.Fatalf("dead letters = %+v, want B with its record", dl.letters)
	}
}

func TestActionRequestsNameExistingTargets(t *testing.T) {
	h := newHarness(t, chainSet())
	ctx := context.Background()
	// Errors name the action as the API spells it, not as the engine stores it.
	if err := RequestMessageAction(ctx, h.pool, "", "A", h.prefix+"missing", ActionExpire); !errors.Is(err, ErrNotFound) ||
		!strings.HasPrefix(err.Error(), "request Expire on ") {
		t.Fatalf("message action on a missing message: %v, want ErrNotFound naming Expire", err)
	}
	if err := RequestInstanceAction(ctx, h.pool, "", "chain", h.ctxID("missing"), ActionClose); !errors.Is(err, ErrNotFound) ||
		!strings.HasPrefix(err.Error(), "request Close on ") {
		t.Fatalf("instance action on a missing instance: %v, want ErrNotFound naming Close", err)
	}
	h.process(h.rec("A", "a1", "x"))
	if err := RequestMessageAction(ctx, h.pool, "", "A", h.prefix+"a1", MessageAction("DROP")); err == nil {
		t.Fatal("unknown message action accepted")
	}
	if err := RequestInstanceAction(ctx, h.pool, "", "chain", h.ctxID("x"), InstanceAction("DROP")); err == nil {
		t.Fatal("unknown instance action accepted")
	}
}

func TestActionsWaitWhileAReleaseHoldsTheInstance(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("B", "b1", "x"))
	if err := RequestInstanceAction(context.Background(), h.pool, "", "chain", h.ctxID("x"), ActionConsumeAll); err != nil {
		t.Fatal(err)
	}
	tx := h.lockInstanceInTx("chain", "x", lockInstanceSQL)
	h.runActions(0)
	if n := h.listener.callCount(); n != 0 {
		t.Fatalf("listener calls = %d, want 0 while the instance is locked", n)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.runActions(1)
	if got := h.listener.deliveredTypes(h.ctxID("x")); !slices.Equal(got, []string{"B"}) {
		t.Fatalf("delivered %v, want [B]", got)
	}
}

// TestExecutedActionsAreLoggedAsTheAPISpellsThem: the log line of an executed action names it as
// a SequentialInboxAction does (ConsumeAll, Expire), not as the engine stores it.
func TestExecutedActionsAreLoggedAsTheAPISpellsThem(t *testing.T) {
	var (
		mu    sync.Mutex
		lines []string
	)
	h := newHarness(t, chainSet(), func(s *harnessSettings) {
		s.Log = funcr.New(func(_, args string) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, args)
		}, funcr.Options{})
	})
	h.process(h.rec("B", "b1", "x"))
	h.process(h.rec("C", "c1", "y"))
	h.request("C", "c1", ActionExpire)
	if err := RequestInstanceAction(context.Background(), h.pool, "", "chain", h.ctxID("x"), ActionConsumeAll); err != nil {
		t.Fatal(err)
	}
	h.runActionsUntilDone(&recordingDeadLetterer{})
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{`"action"="Expire"`, `"action"="ConsumeAll"`} {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, want) }) {
			t.Errorf("no log line with %s in %q", want, lines)
		}
	}
}
