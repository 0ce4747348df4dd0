package fault

import (
	"context"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestPostgresStoppedAndStarted stops a private PostgreSQL server (hack/postgres.sh, never the
// shared one) while a sink call is in flight and records keep arriving, lets the held call succeed
// during the outage, and starts the server again: everything is delivered, nothing is lost or
// stalled. The call that succeeded while the database was down could not be recorded at all, so
// the spec allows its message a second delivery, as for any record in flight at the outage.
func TestPostgresStoppedAndStarted(t *testing.T) {
	const partitions, group = 2, "fault-postgres"
	_, seeds := kafka(t, partitions, true)
	server := privatePostgres(t)
	db := server.database(t)
	const held = "pg-o10-created"
	s := newSink(t, func(id string, attempt int) bool { return id == held && attempt == 1 })
	// The held call and its record may last through the outage.
	manifest := inbox{group: group, sinkURL: s.srv.URL, maxPollIntervalMs: 120000, sinkTimeout: time.Minute, poolSize: poolSize}.write(t)
	a := startConsumer(t, "consumer-a", manifest, db, seeds)
	a.waitReady(t)

	first, ids := orders("pg", 20, partitions)
	testenv.Produce(t, seeds, first...)
	waitUntil(t, "the sink holds "+held, func() bool { return s.holding(held) })
	// /metrics reads the database too, so the consumer's log tells what it does during the outage.
	const retrying = "processing failed; retrying the record"
	retries := strings.Count(a.logTail(1<<20), retrying)
	server.stop(t)
	during, idsDuring := orders("pgdown", 10, partitions)
	testenv.Produce(t, seeds, during...)
	ids = append(ids, idsDuring...)
	waitUntil(t, "the consumer retries records while PostgreSQL is down", func() bool {
		return strings.Count(a.logTail(1<<20), retrying) > retries
	})
	s.release.Open()
	waitUntil(t, "the held call was answered during the outage", func() bool { return s.acceptedCount(held) == 1 })
	restarted := time.Now()
	server.start(t)
	settle(t, s, ids, seeds, group)
	last := time.Time{}
	for _, id := range ids {
		if at, _ := s.acceptedAt(id); at.After(last) {
			last = at
		}
	}

	r := count(t, s, ids, seeds, group)
	r.report(t, "PostgreSQL stopped and started", last.Sub(restarted))
	t.Logf("the message whose call succeeded during the outage was delivered %d times", s.acceptedCount(held))
	checkNothingLost(t, r, s, poolSize/2)
}

// pgServer is the private PostgreSQL server of hack/postgres.sh (SEQINBOX_PG_PRIVATE=1, port
// 55432 by default), which a test may stop and start; the shared server is never touched.
type pgServer struct {
	root, url string
}

// privatePostgres starts the private server unless it runs; the test stops it again when it
// started it.
func privatePostgres(t testing.TB) *pgServer {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	s := &pgServer{root: root}
	wasUp := s.answers()
	s.start(t)
	if !wasUp {
		t.Cleanup(func() { s.stop(t) })
	}
	return s
}

func (s *pgServer) script(t testing.TB, args ...string) string {
	t.Helper()
	out, err := s.run(args...)
	if err != nil {
		t.Fatalf("hack/postgres.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// run runs hack/postgres.sh with SEQINBOX_PG_PRIVATE=1 and returns its last line of output.
func (s *pgServer) run(args ...string) (string, error) {
	var argv []string
	for _, a := range args {
		if a != "" {
			argv = append(argv, a)
		}
	}
	cmd := exec.Command("bash", append([]string{filepath.Join(s.root, "hack", "postgres.sh")}, argv...)...)
	cmd.Env = append(os.Environ(), "SEQINBOX_PG_PRIVATE=1")
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil {
		return string(out), err
	}
	return lines[len(lines)-1], nil
}

// start starts the server (or finds it running). Its port lies in the kernel's ephemeral range,
// so a client socket of another process may hold it for a moment: start tries until it answers.
func (s *pgServer) start(t testing.TB) {
	t.Helper()
	var out string
	var err error
	waitUntil(t, "the private PostgreSQL server started", func() bool {
		out, err = s.run("")
		return err == nil && strings.HasPrefix(out, "postgres://")
	})
	s.url = out
}

// stop stops the server with pg_ctl (fast mode: sessions are terminated).
func (s *pgServer) stop(t testing.TB) {
	t.Helper()
	s.script(t, "stop")
	waitUntil(t, "the private PostgreSQL server is down", func() bool { return !s.answers() })
}

func (s *pgServer) answers() bool {
	url := s.url
	if url == "" {
		url = "postgres://postgres@127.0.0.1:55432/postgres?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return false
	}
	_ = conn.Close(ctx)
	return true
}

// database creates a migrated database on the server, dropped when the test ends.
func (s *pgServer) database(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("seqinbox_fault_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(ctx) }()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), s.url)
		if err != nil {
			return
		}
		defer func() { _ = c.Close(context.Background()) }()
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u, err := neturl.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	migrate(t, u.String())
	return u.String()
}
