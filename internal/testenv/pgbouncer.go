package testenv

import (
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// PgBouncer starts a PgBouncer of the test's own (hack/pgbouncer.sh on a free port, transaction
// pooling, poolSize server connections per database and user) and returns dbURL with its host
// replaced by that PgBouncer's, which serves every database of the server. It stops with the
// test. Tests that need a pooler of a given size use it instead of the shared one on port 6432.
func PgBouncer(t testing.TB, dbURL string, poolSize int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	if _, err := PgBouncerScript(port, poolSize); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := PgBouncerScript(port, poolSize, "stop"); err != nil {
			t.Error(err)
		}
	})
	u, err := neturl.Parse(dbURL)
	if err != nil {
		t.Fatalf("database URL: %v", err)
	}
	u.Host = "127.0.0.1:" + strconv.Itoa(port)
	return u.String()
}

// PgBouncerScript runs hack/pgbouncer.sh with args for the PgBouncer on port with poolSize server
// connections and returns what it prints (the URL through it); its error carries the script's
// stderr.
func PgBouncerScript(port, poolSize int, args ...string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("bash", append([]string{filepath.Join(root, "hack", "pgbouncer.sh")}, args...)...)
	cmd.Env = append(os.Environ(),
		"SEQINBOX_PGBOUNCER_PORT="+strconv.Itoa(port), "SEQINBOX_PGBOUNCER_POOL_SIZE="+strconv.Itoa(poolSize))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/pgbouncer.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}
