package consumer

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

// TestAConsumerRunsWithTheDocumentedPrivilegesOnly migrates a fresh database as its owner, grants
// a new role exactly the statements of docs/privileges.md, and runs a consumer as that role: it
// registers, claims, buffers an early message and releases it in order, as with the owner's role.
func TestAConsumerRunsWithTheDocumentedPrivilegesOnly(t *testing.T) {
	ctx := context.Background()
	ownerURL := testenv.FreshDatabase(t, "consumer_privileges")
	owner := testenv.Pool(t, ownerURL)
	if _, err := migrations.Apply(ctx, owner); err != nil {
		t.Fatalf("migrate as the owner: %v", err)
	}
	role := fmt.Sprintf("seqinbox_app_%d", time.Now().UnixNano())
	if _, err := owner.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'app'`, role)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s`, role))
		_, _ = owner.Exec(context.Background(), fmt.Sprintf(`DROP ROLE %s`, role))
	})
	for _, grant := range documentedGrants(t) {
		if _, err := owner.Exec(ctx, strings.ReplaceAll(grant, "seqinbox_app", role)); err != nil {
			t.Fatalf("%s: %v", grant, err)
		}
	}
	appURL, err := url.Parse(ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	appURL.User = url.UserPassword(role, "app")

	seeds := testenv.Kafka(t, 1, "orders", "orders.dlq")
	s := newSink(t, nil)
	inbox := testInbox(t, seeds, "g-privileges", s.srv.URL, sinkOpts{})
	r := startConsumer(t, inbox, "privileges-1", func(c *Config) { c.DatabaseURL = appURL.String() })
	r.waitReady(t)
	testenv.Produce(t, seeds, event(0, "OrderPaid", "priv-2", "priv-o1"), event(0, "OrderCreated", "priv-1", "priv-o1"))
	waitUntil(t, "both messages reached the sink", func() bool { return len(s.accepted()) == 2 })
	if got := s.acceptedOrder("priv-o1"); len(got) != 2 || got[0] != "OrderCreated" || got[1] != "OrderPaid" {
		t.Errorf("sink order = %v, want OrderCreated, OrderPaid", got)
	}
}

// documentedGrants are the statements of the sql block of docs/privileges.md.
func documentedGrants(t *testing.T) []string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "privileges.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```sql\n(.*?)```").FindSubmatch(page)
	if m == nil {
		t.Fatal("docs/privileges.md shows no sql block")
	}
	var grants []string
	for _, line := range strings.Split(strings.TrimSpace(string(m[1])), "\n") {
		grants = append(grants, strings.TrimSuffix(line, ";"))
	}
	return grants
}
