package docs_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// walkthroughServers are the commands of the README's walkthrough that run until stopped (the
// README starts them in terminals of their own), with what tells that they serve.
var walkthroughServers = map[string]func() bool{
	"bin/seqinbox-dev dev kafka": func() bool { return answers("127.0.0.1:9092") },
	"bin/seqinbox consume -f":    func() bool { return true },
}

// producerCommand is the command the README names to send the events of an order.
const producerCommand = "go run ./docs/examples/producer"

// TestTheReadmeWalkthroughDeliversTheSampleOrderInSequence follows "Run it yourself" as a reader
// does, from the repository's root: every command of its code blocks in order, as written (the
// servers among them in the background), then the producer the README names, with the service of
// the sample manifest listening on 127.0.0.1:8090. The events the producer sends out of order
// must reach the service in the order the sample declares. A command that fails, a server that
// never serves, or an order that does not arrive fails the test.
func TestTheReadmeWalkthroughDeliversTheSampleOrderInSequence(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the walkthrough")
	}
	root := repoRoot(t)
	section := readmeSection(t, readFile(t, filepath.Join(root, "README.md")), "## Run it yourself")
	if !strings.Contains(section, "`"+producerCommand+"`") {
		t.Fatalf("README's walkthrough no longer names %q", producerCommand)
	}
	lines := shellLines(section)
	if len(lines) == 0 {
		t.Fatal("README's walkthrough has no commands")
	}

	received := make(chan string, 16)
	sink := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		received <- r.Header.Get("ce-type")
		w.WriteHeader(http.StatusOK)
	})}
	l, err := net.Listen("tcp", "127.0.0.1:8090")
	if err != nil {
		t.Fatalf("the sample's service address: %v", err)
	}
	go func() { _ = sink.Serve(l) }()
	t.Cleanup(func() { _ = sink.Close() })

	// The reader's database: hack/postgres.sh prints this one (it answers), fresh for the test.
	env := append(os.Environ(), "SEQINBOX_TEST_DATABASE_URL="+testenv.FreshDatabase(t, "docs_walkthrough"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	for _, line := range lines {
		t.Logf("$ %s", line)
		if name, ok := exportOf(line); ok {
			out, err := bashIn(ctx, root, env, line+`; printf '%s' "$`+name+`"`).Output()
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			env = append(env, name+"="+string(out))
			continue
		}
		if serves := serverOf(line); serves != nil {
			cmd := bashIn(context.Background(), root, env, "exec "+line)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			log := &lockedBuffer{}
			cmd.Stdout, cmd.Stderr = log, log
			if err := cmd.Start(); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			t.Cleanup(func() {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(30 * time.Second):
					_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				}
				t.Logf("output of %q:\n%s", line, log.String())
			})
			testenv.WaitUntil(t, line+" to serve", time.Minute, serves)
			continue
		}
		if out, err := bashIn(ctx, root, env, line).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
	}
	t.Logf("$ %s", producerCommand)
	if out, err := bashIn(ctx, root, env, producerCommand).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", producerCommand, err, out)
	}

	want := []string{"OrderCreated", "OrderPaid"}
	var got []string
	deadline := time.After(3 * time.Minute)
	for len(got) < len(want) {
		select {
		case typ := <-received:
			got = append(got, typ)
		case <-deadline:
			t.Fatalf("the service received %v within 3 minutes, want %v", got, want)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the service received %v, want %v in that order", got, want)
	}
}

// readmeSection returns the part of the README under heading, up to the next heading of its level.
func readmeSection(t *testing.T, readme, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README has no section %q", heading)
	}
	section, _, _ := strings.Cut(rest, "\n## ")
	return section
}

// shellComment is a comment at the end of a command line.
var shellComment = regexp.MustCompile(`\s+#\s.*$`)

// shellLines returns the command lines of the section's sh code blocks, in order, without their
// comments.
func shellLines(section string) []string {
	var lines []string
	inBlock := false
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inBlock = true
		case strings.HasPrefix(line, "```"):
			inBlock = false
		case inBlock && strings.TrimSpace(line) != "":
			lines = append(lines, strings.TrimSpace(shellComment.ReplaceAllString(line, "")))
		}
	}
	return lines
}

// exportOf returns NAME of `export NAME=VALUE`.
func exportOf(line string) (name string, ok bool) {
	rest, ok := strings.CutPrefix(line, "export ")
	if !ok {
		return "", false
	}
	name, _, ok = strings.Cut(rest, "=")
	return name, ok
}

// serverOf returns the readiness check of a command that runs until stopped, nil for others.
func serverOf(line string) func() bool {
	for prefix, serves := range walkthroughServers {
		if strings.HasPrefix(line, prefix) {
			return serves
		}
	}
	return nil
}

// bashIn runs a command line with bash in dir.
func bashIn(ctx context.Context, dir string, env []string, line string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	return cmd
}

// answers reports whether something accepts TCP connections at addr.
func answers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// lockedBuffer collects a background command's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
