package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// The racing test of the partition workers (keyed.go) under rebalances: consumers of one group
// join, leave and are killed while records of several orders and Kafka keys of every partition
// are in flight, held behind an earlier record of their key, or in claim batches.
const (
	racePartitions = 4
	// raceKeys Kafka keys per partition are shared by the orders placed there, so that records
	// of different orders wait for each other.
	raceKeys           = 3
	raceOrdersPerRound = 8
	// raceHeldPerRound partitions per round start with a record whose first sink call is held
	// until the round's churn began; fewer than a consumer's in-flight records (poolSize 10: 5),
	// so that a consumer owning every held record still processes the rest.
	raceHeldPerRound = 2
	// raceSinkDelay bounds the sink's random answer time.
	raceSinkDelay = 15 * time.Millisecond
)

// raceChurn is what happens to the group in each round while its held calls hang: a consumer
// joins, one leaves gracefully, or one is killed. From two consumers the group goes through one
// to three and back to two; the rounds go through it raceRounds/len(raceChurn) times.
var raceChurn = []string{"join", "kill", "join", "leave", "kill", "join", "leave", "join"}

// raceRounds is how many rounds a run has.
const raceRounds = 16

// raceKind is what a racing test expects of a logical message.
type raceKind int

const (
	// deliverOnce: accepted by the sink exactly once.
	deliverOnce raceKind = iota
	// failAlways: the sink fails every call; dead-lettered as ListenerFailed, never accepted.
	failAlways
	// undeclared: a type no sequence declares; dead-lettered as UndeclaredType, never sent.
	undeclared
)

// raceMessage is a logical message of a racing test and the records that carry it.
type raceMessage struct {
	id, typ, order string
	kind           raceKind
	copies         []*raceRecord
}

// raceRecord is one record of a message as produced.
type raceRecord struct {
	m *raceMessage
	r *kgo.Record
}

// raceWorkload builds the records of the rounds from one seed.
type raceWorkload struct {
	rnd      *rand.Rand
	messages map[string]*raceMessage
	byOrder  map[string][]*raceMessage
	// round are the records of the round being built, per partition.
	round [racePartitions][]*raceRecord
}

// raceRound is what one round produces.
type raceRound struct {
	records []*raceRecord
	// held are the records whose first sink call waits for the round's latch, free a record
	// behind each in its partition that waits for nothing.
	held, free []*raceRecord
}

// place picks a partition and one of its keys.
func (w *raceWorkload) place() (int32, string) {
	p := w.rnd.Int32N(racePartitions)
	return p, fmt.Sprintf("p%d-k%d", p, w.rnd.IntN(raceKeys))
}

// add puts a copy of message id (created on first use) on partition p under key.
func (w *raceWorkload) add(p int32, key, typ, id, order string, kind raceKind) *raceRecord {
	m := w.messages[id]
	if m == nil {
		m = &raceMessage{id: id, typ: typ, order: order, kind: kind}
		w.messages[id] = m
		w.byOrder[order] = append(w.byOrder[order], m)
	}
	var extra []kgo.RecordHeader
	if typ == "OrderValidated" {
		extra = append(extra, kgo.RecordHeader{Key: "ce_result", Value: []byte("OK")})
	}
	r := event(p, typ, id, order, extra...)
	r.Key = []byte(key)
	rr := &raceRecord{m: m, r: r}
	m.copies = append(m.copies, rr)
	w.round[p] = append(w.round[p], rr)
	return rr
}

// build makes the records of a round (or of its burst, without held records), their ids
// starting with prefix: per held partition an order whose OrderCreated comes first (its later
// records and others of its key wait for it) and a record of its own key behind it; orders
// whose messages lie in one partition under one key or spread over partitions and keys, in any
// order (so that successors are buffered and released); OrderValidated messages, some of which
// the sink always fails; copies of messages in the same or another partition; records of an
// undeclared type.
func (w *raceWorkload) build(prefix string, held int) raceRound {
	var rd raceRound
	w.round = [racePartitions][]*raceRecord{}
	for _, p := range w.rnd.Perm(racePartitions)[:held] {
		p := int32(p)
		order := fmt.Sprintf("%s-h%d", prefix, p)
		rd.held = append(rd.held, w.add(p, fmt.Sprintf("p%d-k0", p), "OrderCreated", order+"-OrderCreated", order, deliverOnce))
		for _, typ := range businessOrder[1:] {
			w.add(p, fmt.Sprintf("p%d-k%d", p, w.rnd.IntN(raceKeys)), typ, order+"-"+typ, order, deliverOnce)
		}
		free := fmt.Sprintf("%s-f%d", prefix, p)
		rd.free = append(rd.free, w.add(p, fmt.Sprintf("p%d-free", p), "OrderCreated", free+"-OrderCreated", free, deliverOnce))
	}
	for i := range raceOrdersPerRound {
		order := fmt.Sprintf("%s-o%d", prefix, i)
		together := w.rnd.IntN(2) == 0
		p, key := w.place()
		for _, ti := range w.rnd.Perm(len(businessOrder)) {
			if !together {
				p, key = w.place()
			}
			w.add(p, key, businessOrder[ti], order+"-"+businessOrder[ti], order, deliverOnce)
		}
		if w.rnd.IntN(3) == 0 {
			kind := deliverOnce
			if w.rnd.IntN(2) == 0 {
				kind = failAlways
			}
			p, key := w.place()
			w.add(p, key, "OrderValidated", order+"-OrderValidated", order, kind)
		}
		if w.rnd.IntN(2) == 0 {
			ms := w.byOrder[order]
			m := ms[w.rnd.IntN(len(ms))]
			first := m.copies[0].r
			p, key := first.Partition, string(first.Key)
			if w.rnd.IntN(2) == 0 {
				p, key = w.place()
			}
			w.add(p, key, m.typ, m.id, order, m.kind)
		}
	}
	for i := range 2 {
		p, key := w.place()
		id := fmt.Sprintf("%s-inv%d", prefix, i)
		w.add(p, key, "InvoiceSent", id, id, undeclared)
	}
	for p := range w.round {
		recs := w.round[p]
		w.rnd.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
		for _, h := range rd.held {
			if i := slices.Index(recs, h); i > 0 {
				copy(recs[1:i+1], recs[:i])
				recs[0] = h
			}
		}
		rd.records = append(rd.records, recs...)
	}
	return rd
}

// sinkCall is one request the race sink answered, or saw abandoned (status 0), as an interval
// [start, end] of the sink's counter.
type sinkCall struct {
	id, caller string
	status     int
	start, end int64
}

// raceSink answers after a random delay up to raceSinkDelay; fails the messages it is told to,
// always or on the first attempt; holds the first call of a held message until its latch opens;
// and, once a caller is doomed (about to be killed), holds every call of it that was not
// answered yet until its client goes away. Each consumer calls it at its own path, so that
// every call names its caller.
type raceSink struct {
	srv                  *httptest.Server
	mu                   sync.Mutex
	rnd                  *rand.Rand
	tick                 int64
	calls                []sinkCall
	attempts             map[string]int
	failing, failOnFirst map[string]bool
	held                 map[string]*testenv.Latch
	// holding names the caller of each held call at its latch; hanging counts the held and
	// doomed calls per caller.
	holding map[string]string
	hanging map[string]int
	doomed  map[string]bool
}

func newRaceSink(t *testing.T, seed uint64) *raceSink {
	s := &raceSink{
		rnd: rand.New(rand.NewPCG(seed, 1)), attempts: map[string]int{}, failing: map[string]bool{}, failOnFirst: map[string]bool{},
		held: map[string]*testenv.Latch{}, holding: map[string]string{}, hanging: map[string]int{}, doomed: map[string]bool{},
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *raceSink) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	id, caller := r.Header.Get("ce-id"), strings.TrimPrefix(r.URL.Path, "/")
	s.mu.Lock()
	s.attempts[id]++
	first := s.attempts[id] == 1
	status := http.StatusOK
	switch {
	case s.failing[id]:
		status = http.StatusInternalServerError
	case first && s.failOnFirst[id]:
		status = http.StatusServiceUnavailable
	}
	var latch *testenv.Latch
	if first {
		latch = s.held[id]
	}
	delay := time.Duration(s.rnd.Int64N(int64(raceSinkDelay)))
	s.tick++
	c := sinkCall{id: id, caller: caller, start: s.tick}
	s.mu.Unlock()

	if !s.await(r.Context(), id, caller, latch, delay) {
		status = 0
	}
	s.mu.Lock()
	s.tick++
	c.status, c.end = status, s.tick
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
	}
}

// await holds a call at its latch (if any), then for delay, then, when its caller is doomed,
// until the client goes away; false when the client went away.
func (s *raceSink) await(ctx context.Context, id, caller string, latch *testenv.Latch, delay time.Duration) bool {
	if latch != nil {
		s.hang(caller, id, 1)
		open := latch.Wait(ctx)
		s.hang(caller, id, -1)
		if !open {
			return false
		}
	}
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return false
	}
	s.mu.Lock()
	doomed := s.doomed[caller]
	s.mu.Unlock()
	if doomed {
		s.hang(caller, "", 1)
		<-ctx.Done()
		s.hang(caller, "", -1)
		return false
	}
	return true
}

// hang counts a call of caller that starts (n = 1) or stops (-1) being held; id names it at its
// latch.
func (s *raceSink) hang(caller, id string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hanging[caller] += n
	if id != "" && n > 0 {
		s.holding[id] = caller
	} else if id != "" {
		delete(s.holding, id)
	}
}

// hold makes the first call of each record's message wait until latch opens.
func (s *raceSink) hold(latch *testenv.Latch, recs []*raceRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rr := range recs {
		s.held[rr.m.id] = latch
	}
}

// fail makes the sink fail every call of the failAlways messages among recs, and the first call
// of the others for which onFirst holds.
func (s *raceSink) fail(recs []*raceRecord, onFirst func(*raceRecord) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rr := range recs {
		switch {
		case rr.m.kind == failAlways:
			s.failing[rr.m.id] = true
		case rr.m.kind == deliverOnce && onFirst(rr):
			s.failOnFirst[rr.m.id] = true
		}
	}
}

// holder is the caller whose call of id waits at its latch now, "" when none does.
func (s *raceSink) holder(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holding[id]
}

// hangingCalls counts the calls of caller held now.
func (s *raceSink) hangingCalls(caller string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hanging[caller]
}

// doom makes every call of caller not answered yet hang until its client goes away.
func (s *raceSink) doom(caller string) {
	s.mu.Lock()
	s.doomed[caller] = true
	s.mu.Unlock()
}

// byID returns the calls of every message in the order they ended.
func (s *raceSink) byID() map[string][]sinkCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]sinkCall{}
	for _, c := range s.calls {
		out[c.id] = append(out[c.id], c)
	}
	return out
}

// accepted is the first 2xx answer among calls, if any.
func accepted(calls []sinkCall) (sinkCall, bool) {
	for _, c := range calls {
		if c.status >= 200 && c.status < 300 {
			return c, true
		}
	}
	return sinkCall{}, false
}

// raceLedger is every record a racing test produced and what became of it: the Events of all
// consumers by partition and offset, and each time a committed offset passed a record that had
// not reached an end.
type raceLedger struct {
	mu       sync.Mutex
	produced map[int32]map[int64]*raceRecord
	events   map[int32]map[int64][]Event
	skipped  []string
	reported map[[2]int64]bool
}

func newRaceLedger() *raceLedger {
	l := &raceLedger{produced: map[int32]map[int64]*raceRecord{}, events: map[int32]map[int64][]Event{}, reported: map[[2]int64]bool{}}
	for p := range int32(racePartitions) {
		l.produced[p], l.events[p] = map[int64]*raceRecord{}, map[int64][]Event{}
	}
	return l
}

// tweak makes a consumer report its Events to the ledger too.
func (l *raceLedger) tweak(c *Config) {
	next := c.OnRecord
	c.OnRecord = func(e Event) {
		l.mu.Lock()
		l.events[e.Origin.Partition][e.Origin.Offset] = append(l.events[e.Origin.Partition][e.Origin.Offset], e)
		l.mu.Unlock()
		next(e)
	}
}

// add files produced records under their offsets.
func (l *raceLedger) add(recs []*raceRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, rr := range recs {
		l.produced[rr.r.Partition][rr.r.Offset] = rr
	}
}

// allEnded reports whether every produced record has an Event.
func (l *raceLedger) allEnded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, recs := range l.produced {
		for off := range recs {
			if len(l.events[p][off]) == 0 {
				return false
			}
		}
	}
	return true
}

// skippedCommits says where a committed offset passed a record that had not reached an end.
func (l *raceLedger) skippedCommits() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.skipped)
}

func (l *raceLedger) eventsOf(rr *raceRecord) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events[rr.r.Partition][rr.r.Offset])
}

// checkCommitted notes every produced record below a committed offset without an Event: the
// commit skipped a record that had not reached an end. The Event of a record comes before its
// offset is marked for commit, so the offsets are read before the Events.
func (l *raceLedger) checkCommitted(committed map[int32]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, at := range committed {
		for off, rr := range l.produced[p] {
			if off < at && len(l.events[p][off]) == 0 && !l.reported[[2]int64{int64(p), off}] {
				l.reported[[2]int64{int64(p), off}] = true
				l.skipped = append(l.skipped, fmt.Sprintf("partition %d committed at %d before offset %d (%s) reached an end", p, at, off, rr.m.id))
			}
		}
	}
}

// raceMember is a consumer of the racing group, named at its sink path and as its database
// sessions' application_name.
type raceMember struct {
	*running
	name string
}

// raceGroup starts the consumers of a racing test.
type raceGroup struct {
	t       *testing.T
	seeds   []string
	sinkURL string
	ledger  *raceLedger
	started int
	alive   []*raceMember
}

// join starts another consumer in the group.
func (g *raceGroup) join() *raceMember {
	g.started++
	name := fmt.Sprintf("race-%d", g.started)
	in := testInbox(g.t, g.seeds, "g-race", g.sinkURL+"/"+name, sinkOpts{timeout: 20 * time.Second, retries: 1})
	// Long enough for a held call; rebalances are seen within 100ms.
	in.Spec.Kafka.MaxPollIntervalMs, in.Spec.Kafka.HeartbeatIntervalMs = 60000, 100
	u, err := url.Parse(dbURL)
	if err != nil {
		g.t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	m := &raceMember{name: name, running: startConsumer(g.t, in, name, g.ledger.tweak, func(c *Config) { c.DatabaseURL = u.String() })}
	g.alive = append(g.alive, m)
	return m
}

// member returns the alive consumer of that name.
func (g *raceGroup) member(name string) *raceMember {
	for _, m := range g.alive {
		if m.name == name {
			return m
		}
	}
	g.t.Fatalf("no alive consumer %s", name)
	return nil
}

// remove takes m out of the alive consumers before it stops.
func (g *raceGroup) remove(m *raceMember) {
	g.alive = slices.DeleteFunc(g.alive, func(o *raceMember) bool { return o == m })
}

// quietFor reports whether each record or batch m has in the engine is at a held sink call or
// waits for a lock in PostgreSQL (a claim or an instance another one holds): then no sink
// answer is on its way to m, which m might receive and record but be killed before it commits
// (a crash in that instant delivers the message twice, which no claim can prevent).
func quietFor(t *testing.T, pool *pgxpool.Pool, s *raceSink, m *raceMember) bool {
	t.Helper()
	hanging := s.hangingCalls(m.name)
	var waiting int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, m.name).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	return hanging > 0 && float64(hanging+waiting) == gauge(t, m.c, "seqinbox_records_in_flight", "", "")
}

// TestRecordsInFlightWhileConsumersJoinLeaveAndDieReachAnEndOnceInOrderAndNoCommitSkipsOne
// races the partition workers' grouping by key and instance, their claim batches and their
// commit mark against rebalances. Rounds of records (orders spread over partitions and keys in
// any order, copies of messages, messages the sink always fails, undeclared types) go to a
// four-partition topic; in each round the first sink call of two partitions' head records is
// held, so that records of their keys wait behind them while later ones finish, and while they
// hang a consumer joins, leaves or is killed. After all: every record reached an end (an
// Event; Failed and DeadLettered ones in the dead-letter topic with their reason), every
// message that should be was accepted exactly once, no two calls of one message overlapped,
// each order's messages were accepted in their declared order and each Kafka key's in offset
// order, no committed offset ever passed a record that had not reached an end, and the group's
// committed lag is zero.
func TestRecordsInFlightWhileConsumersJoinLeaveAndDieReachAnEndOnceInOrderAndNoCommitSkipsOne(t *testing.T) {
	pool := database(t)
	seeds := cluster(t, racePartitions)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	s := newRaceSink(t, seed)
	ledger := newRaceLedger()
	// Also when a wait timed out: a commit past a record that then never comes is why.
	t.Cleanup(func() {
		for _, skipped := range ledger.skippedCommits() {
			t.Errorf("a committed offset passed a record that had not reached an end: %s", skipped)
		}
	})
	w := &raceWorkload{rnd: rand.New(rand.NewPCG(seed, 0)), messages: map[string]*raceMessage{}, byOrder: map[string][]*raceMessage{}}
	g := &raceGroup{t: t, seeds: seeds, sinkURL: s.srv.URL, ledger: ledger}

	stopWatch, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if committed, err := testenv.CommittedOffsets(seeds, "g-race", "orders"); err == nil {
				ledger.checkCommitted(committed)
			}
		}
	}()
	defer func() {
		select {
		case <-watchDone:
		default:
			close(stopWatch)
			<-watchDone
		}
	}()

	g.join()
	g.join()
	// wait fails at once when a commit skipped a record: the waits would time out on it.
	wait := func(what string, cond func() bool) {
		t.Helper()
		waitUntil(t, what, func() bool {
			if len(ledger.skippedCommits()) > 0 {
				t.Fatalf("waiting until %s: a committed offset passed a record that had not reached an end", what)
			}
			return cond()
		})
	}
	produce := func(rd raceRound, latch *testenv.Latch) {
		s.hold(latch, rd.held)
		s.fail(rd.records, func(rr *raceRecord) bool { return !slices.Contains(rd.held, rr) && w.rnd.IntN(8) == 0 })
		recs := make([]*kgo.Record, len(rd.records))
		for i, rr := range rd.records {
			recs[i] = rr.r
		}
		testenv.Produce(t, seeds, recs...)
		ledger.add(rd.records)
	}
	for n := range raceRounds {
		churn := raceChurn[n%len(raceChurn)]
		// The held records are then the first their partitions take: each is processed on its
		// own, so that no claim batch holds other claims while its call is held. And no
		// partition is on its way to another consumer, whose revocation would wait for a held
		// call.
		wait(fmt.Sprintf("round %d: every record so far reached an end and every partition is assigned", n), func() bool {
			described := describeGroup(t, seeds, "g-race")
			return ledger.allEnded() && described.State == "Stable" && len(described.Members) == len(g.alive) &&
				assignedPartitions(described.Members) == racePartitions
		})
		rd := w.build(fmt.Sprintf("r%d", n), raceHeldPerRound)
		latch := testenv.NewLatch()
		produce(rd, latch)
		wait(fmt.Sprintf("round %d: its held calls hang and a record behind each reached an end", n), func() bool {
			for i, h := range rd.held {
				if s.holder(h.m.id) == "" || len(ledger.eventsOf(rd.free[i])) == 0 {
					return false
				}
			}
			return true
		})
		// A burst behind them: records in flight, and waiting for the held ones, as the group
		// changes.
		produce(w.build(fmt.Sprintf("b%d", n), 0), latch)
		// A consumer that leaves or is killed has a held call in flight.
		victim := g.member(s.holder(rd.held[w.rnd.IntN(len(rd.held))].m.id))
		switch churn {
		case "join":
			g.join()
			wait(fmt.Sprintf("round %d: the new consumer is in the group", n), func() bool {
				return len(groupMembers(t, seeds, "g-race")) == len(g.alive)
			})
			latch.Open()
		case "leave":
			g.remove(victim)
			stopped := make(chan error, 1)
			go func() { stopped <- victim.stop(t) }()
			wait(fmt.Sprintf("round %d: %s is leaving", n, victim.name), func() bool { ready, _ := victim.c.Ready(); return !ready })
			latch.Open()
			if err := <-stopped; err != nil {
				t.Fatalf("round %d: %s stopped with %v", n, victim.name, err)
			}
		case "kill":
			g.remove(victim)
			s.doom(victim.name)
			quiet := 0
			wait(fmt.Sprintf("round %d: every record %s processes is at a held call or waits for a lock", n, victim.name), func() bool {
				if quietFor(t, pool, s, victim) {
					quiet++
				} else {
					quiet = 0
				}
				return quiet >= 2
			})
			victim.c.Kill()
			if err := victim.stop(t); !errors.Is(err, ErrKilled) {
				t.Fatalf("round %d: Run of the killed %s returned %v, want ErrKilled", n, victim.name, err)
			}
			latch.Open()
		}
	}
	for len(g.alive) < 2 {
		g.join()
	}

	var all []*raceRecord
	for _, m := range w.messages {
		all = append(all, m.copies...)
	}
	wait("every record reached an end and every message that should be was accepted", func() bool {
		calls := s.byID()
		for _, m := range w.messages {
			if _, ok := accepted(calls[m.id]); m.kind == deliverOnce && !ok {
				return false
			}
		}
		return ledger.allEnded()
	})
	wait("every offset is committed", func() bool {
		for _, lag := range committedLag(t, seeds, "g-race") {
			if lag != 0 {
				return false
			}
		}
		return true
	})
	close(stopWatch)
	<-watchDone
	for _, m := range g.alive {
		if err := m.stop(t); err != nil {
			t.Fatalf("%s stopped with %v", m.name, err)
		}
	}

	assertRaceEnds(t, ledger, all, testenv.ReadTopic(t, seeds, "orders.dlq"))
	calls := s.byID()
	assertRaceDeliveries(t, w.messages, calls)
	assertRaceOrder(t, w, ledger, calls)
	assertRaceRaced(t, ledger, all, calls)
}

// assertRaceEnds checks that every record has an Event that its kind allows, and that each
// Failed or DeadLettered one is in the dead-letter topic with its reason.
func assertRaceEnds(t *testing.T, ledger *raceLedger, all []*raceRecord, letters []*kgo.Record) {
	t.Helper()
	lettered := map[string]bool{}
	for _, l := range letters {
		lettered[headerOf(l, deadletter.HeaderOriginalPartition)+"/"+headerOf(l, deadletter.HeaderOriginalOffset)+"/"+headerOf(l, deadletter.HeaderReason)] = true
	}
	for _, rr := range all {
		for _, e := range ledger.eventsOf(rr) {
			allowed := []string{"Delivered", "Buffered", "Duplicate"}
			reason := ""
			switch rr.m.kind {
			case failAlways:
				allowed, reason = []string{"Failed"}, deadletter.ReasonListenerFailed
			case undeclared:
				allowed, reason = []string{OutcomeDeadLettered}, decode.ClassUndeclaredType
			}
			if !slices.Contains(allowed, e.Outcome) || rr.m.kind == undeclared && e.Reason != reason {
				t.Errorf("%s at %d/%d: %s %s, want one of %v %s", rr.m.id, rr.r.Partition, rr.r.Offset, e.Outcome, e.Reason, allowed, reason)
			}
			at := strconv.Itoa(int(rr.r.Partition)) + "/" + strconv.FormatInt(rr.r.Offset, 10) + "/" + reason
			if reason != "" && !lettered[at] {
				t.Errorf("%s at %d/%d ended %s without a dead letter of reason %s", rr.m.id, rr.r.Partition, rr.r.Offset, e.Outcome, reason)
			}
		}
	}
}

// assertRaceDeliveries checks that every message that should be was accepted exactly once, the
// others never, and that no two calls of one message overlapped.
func assertRaceDeliveries(t *testing.T, messages map[string]*raceMessage, calls map[string][]sinkCall) {
	t.Helper()
	for id, m := range messages {
		n := 0
		for _, c := range calls[id] {
			if c.status >= 200 && c.status < 300 {
				n++
			}
		}
		switch {
		case m.kind == deliverOnce && n != 1:
			t.Errorf("%s accepted %d times, want once", id, n)
		case m.kind == failAlways && (n != 0 || len(calls[id]) == 0):
			t.Errorf("%s (failed by the sink) called %d times, accepted %d times, want called and never accepted", id, len(calls[id]), n)
		case m.kind == undeclared && len(calls[id]) != 0:
			t.Errorf("%s (undeclared type) reached the sink %d times", id, len(calls[id]))
		}
		byStart := slices.SortedFunc(slices.Values(calls[id]), func(a, b sinkCall) int { return int(a.start - b.start) })
		for i := 1; i < len(byStart); i++ {
			if prev := byStart[i-1]; byStart[i].start < prev.end {
				t.Errorf("%s: the call of %s (status %d) began while the call of %s (status %d) was in flight", id, byStart[i].caller, byStart[i].status, prev.caller, prev.status)
			}
		}
	}
}

// assertRaceOrder checks that each order's messages were accepted in their declared order (the
// acceptance of each ended before the successor's was called) and each Kafka key's messages in
// offset order (the acceptance of each ended before the next one's first call began), for the
// messages without a release condition whose every copy lies in one partition under one key
// and that were accepted.
func assertRaceOrder(t *testing.T, w *raceWorkload, ledger *raceLedger, calls map[string][]sinkCall) {
	t.Helper()
	for order, ms := range w.byOrder {
		var prev sinkCall
		for i, typ := range businessOrder {
			idx := slices.IndexFunc(ms, func(m *raceMessage) bool { return m.typ == typ })
			if idx < 0 {
				continue
			}
			c, ok := accepted(calls[ms[idx].id])
			if ok && i > 0 && c.start < prev.end {
				t.Errorf("order %s: %s was called before %s was accepted", order, typ, businessOrder[i-1])
			}
			prev = c
		}
	}
	// Records of one instance run in offset order: a record behind its predecessors in its
	// partition (inOrderBehind) finds them processed and is never buffered.
	for _, ms := range w.byOrder {
		for _, m := range ms {
			for _, rr := range m.copies {
				if !inOrderBehind(ms, m.typ, rr) {
					continue
				}
				for _, e := range ledger.eventsOf(rr) {
					if e.Outcome == "Buffered" {
						t.Errorf("%s at %d/%d was buffered although its predecessors came before it in its partition", m.id, rr.r.Partition, rr.r.Offset)
					}
				}
			}
		}
	}
	type keyed struct {
		m     *raceMessage
		first int64
	}
	byKey := map[string][]keyed{}
	for _, m := range w.messages {
		if m.kind != deliverOnce || (m.typ != "OrderCreated" && m.typ != "OrderValidated") {
			continue
		}
		first := m.copies[0].r
		if slices.ContainsFunc(m.copies, func(rr *raceRecord) bool {
			return rr.r.Partition != first.Partition || string(rr.r.Key) != string(first.Key)
		}) {
			continue
		}
		at := slices.MinFunc(m.copies, func(a, b *raceRecord) int { return int(a.r.Offset - b.r.Offset) }).r.Offset
		key := fmt.Sprintf("%d/%s", first.Partition, first.Key)
		byKey[key] = append(byKey[key], keyed{m, at})
	}
	for key, ks := range byKey {
		slices.SortFunc(ks, func(a, b keyed) int { return int(a.first - b.first) })
		for i := 1; i < len(ks); i++ {
			prev, ok := accepted(calls[ks[i-1].m.id])
			if !ok || len(calls[ks[i].m.id]) == 0 {
				continue
			}
			next := slices.MinFunc(calls[ks[i].m.id], func(a, b sinkCall) int { return int(a.start - b.start) })
			if next.start < prev.end {
				t.Errorf("key %s: %s (offset %d) was called before %s (offset %d) was accepted", key, ks[i].m.id, ks[i].first, ks[i-1].m.id, ks[i-1].first)
			}
		}
	}
}

// inOrderBehind reports whether rr, a record of an order's message of type typ, comes after the
// first copies of all of typ's predecessors (ms are the order's messages), which come in their
// declared order, all copies of them and of rr's message in rr's partition. Otherwise a
// predecessor may be buffered when rr runs, legitimately: buffered in another partition, or by a
// copy before its own predecessor, it is released after the claim batch that rr is in.
func inOrderBehind(ms []*raceMessage, typ string, rr *raceRecord) bool {
	i := slices.Index(businessOrder, typ)
	if i <= 0 {
		return false
	}
	for _, m := range ms {
		if j := slices.Index(businessOrder, m.typ); j >= 0 && j <= i &&
			slices.ContainsFunc(m.copies, func(c *raceRecord) bool { return c.r.Partition != rr.r.Partition }) {
			return false
		}
	}
	at := int64(-1)
	for _, pred := range businessOrder[:i] {
		p := slices.IndexFunc(ms, func(m *raceMessage) bool { return m.typ == pred })
		if p < 0 {
			return false
		}
		first := slices.MinFunc(ms[p].copies, func(a, b *raceRecord) int { return int(a.r.Offset - b.r.Offset) }).r.Offset
		if first <= at {
			return false
		}
		at = first
	}
	return at < rr.r.Offset
}

// assertRaceRaced checks that the run raced at all: successors were buffered and released,
// copies lost their claims, kills cut calls in flight, and several consumers delivered.
func assertRaceRaced(t *testing.T, ledger *raceLedger, all []*raceRecord, calls map[string][]sinkCall) {
	t.Helper()
	outcomes := map[string]int{}
	for _, rr := range all {
		for _, e := range ledger.eventsOf(rr) {
			outcomes[e.Outcome]++
		}
	}
	cut, callers := 0, map[string]bool{}
	for _, cs := range calls {
		for _, c := range cs {
			callers[c.caller] = true
			if c.status == 0 {
				cut++
			}
		}
	}
	t.Logf("%d records, outcomes %v, %d calls cut by a kill, %d consumers called the sink", len(all), outcomes, cut, len(callers))
	if outcomes["Buffered"] == 0 || outcomes["Duplicate"] == 0 || cut == 0 || len(callers) < 4 {
		t.Errorf("the run did not race: outcomes %v, %d calls cut, %d consumers called the sink", outcomes, cut, len(callers))
	}
}
