package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// seqinbox runs one command line in process exactly as main does, and returns what it wrote and
// its exit code.
func seqinbox(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut)
	if err != nil {
		cli.PrintError(&errOut, err)
	}
	return out.String(), errOut.String(), cli.ExitCode(err)
}

// commandPaths lists every command of the tree as its arguments (["deadletters", "retry"]).
func commandPaths(cmd *cobra.Command, parent []string) [][]string {
	var paths [][]string
	for _, sub := range cmd.Commands() {
		path := append(append([]string{}, parent...), sub.Name())
		paths = append(paths, path)
		paths = append(paths, commandPaths(sub, path)...)
	}
	return paths
}

func TestHelpOfEveryCommandExitsZeroWithDescriptionAndExample(t *testing.T) {
	root := newRootCommand()
	paths := append([][]string{nil}, commandPaths(root, nil)...)
	if len(paths) < 8 {
		t.Fatalf("command tree has %d commands, want every subcommand: %v", len(paths), paths)
	}
	for _, path := range paths {
		cmd, _, err := root.Find(path)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.Join(append([]string{"seqinbox"}, path...), " ")
		t.Run(name, func(t *testing.T) {
			if cmd.Short == "" || cmd.Long == "" || cmd.Example == "" {
				t.Fatalf("%s lacks a summary, a description or an example", name)
			}
			firstLine, _, _ := strings.Cut(cmd.Long, "\n")
			for _, args := range [][]string{append(path, "--help"), append(path, "-h"), append([]string{"help"}, path...)} {
				stdout, stderr, code := seqinbox(t, args...)
				if code != cli.ExitOK || stderr != "" {
					t.Fatalf("seqinbox %v: exit %d, stderr %q; want 0 and nothing on stderr", args, code, stderr)
				}
				for _, want := range []string{firstLine, "Examples:", "Usage:\n  " + name} {
					if !strings.Contains(stdout, want) {
						t.Fatalf("seqinbox %v prints no %q:\n%s", args, want, stdout)
					}
				}
			}
		})
	}
}

func TestSubcommandHelpListsItsFlags(t *testing.T) {
	for args, flags := range map[string][]string{
		"deadletters retry -h": {"--filename", "--bootstrap-servers", "--limit", "--filter-reason"},
		"deadletters list -h":  {"--filename", "--bootstrap-servers", "--reason", "--since", "--output"},
		"consume -h":           {"--filename", "--database-url", "--metrics-bind-address", "--health-probe-bind-address", "--instance-id", "--zap-log-level"},
		"operator -h":          {"--metrics-bind-address", "--health-probe-bind-address", "--leader-elect", "--kubeconfig"},
		"migrate -h":           {"--database-url", "--output", "--dry-run"},
	} {
		stdout, _, code := seqinbox(t, strings.Fields(args)...)
		for _, flag := range flags {
			if code != cli.ExitOK || !strings.Contains(stdout, flag) {
				t.Errorf("seqinbox %s (exit %d) does not list %s:\n%s", args, code, flag, stdout)
			}
		}
	}
}

func TestVersionFlagAndCommandPrintTheBuild(t *testing.T) {
	flagOut, _, flagCode := seqinbox(t, "--version")
	cmdOut, _, cmdCode := seqinbox(t, "version")
	if flagCode != cli.ExitOK || cmdCode != cli.ExitOK || flagOut != cmdOut || !strings.Contains(cmdOut, "schema version") {
		t.Fatalf("--version: exit %d %q; version: exit %d %q; want both 0 and the same line", flagCode, flagOut, cmdCode, cmdOut)
	}
	jsonOut, _, code := seqinbox(t, "version", "-o", "json")
	if code != cli.ExitOK || !strings.Contains(jsonOut, `"claimProtocol"`) {
		t.Fatalf("version -o json: exit %d %q", code, jsonOut)
	}
}

func TestConsumeRefusesAMemoryLimitThatIsNoQuantity(t *testing.T) {
	for _, v := range []string{"lots", "-512Mi"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv(envMemoryLimit, v)
			_, stderr, code := seqinbox(t, "consume", "-f", "inbox.yaml")
			if want := fmt.Sprintf("seqinbox consume: %s=%q: want the container's memory limit", envMemoryLimit, v); code != cli.ExitUsage || !strings.HasPrefix(stderr, want) {
				t.Errorf("exit %d, stderr:\n%s\nwant exit %d and a line starting %q", code, stderr, cli.ExitUsage, want)
			}
		})
	}
}

func TestUsageErrorsExitTwoWithOneLineNamingTheProblem(t *testing.T) {
	t.Setenv(envDatabaseURL, "")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `seqinbox: unknown command "bogus" for "seqinbox"`},
		{[]string{"--bogus"}, "seqinbox: unknown flag: --bogus"},
		{[]string{"version", "extra"}, `seqinbox version: takes no arguments, got "extra"`},
		{[]string{"version", "--output", "yaml"}, `seqinbox version: --output "yaml": use text or json`},
		{[]string{"migrate", "-o", "yaml", "--database-url", "postgres://x"}, `seqinbox migrate: --output "yaml": use text or json`},
		{[]string{"migrate"}, "seqinbox migrate: --database-url or SEQINBOX_DATABASE_URL is required"},
		{[]string{"migrate", "--database-url", "mysql://app:s3cret@db/orders"}, "seqinbox migrate: --database-url mysql://…: seqinbox keeps the inbox in PostgreSQL; pass postgres://"},
		{[]string{"consume", "-f", "inbox.yaml", "--database-url", "mysql://app:s3cret@db/orders"}, "seqinbox consume: --database-url mysql://…: seqinbox keeps the inbox in PostgreSQL"},
		{[]string{"action", "--database-url", "jdbc:postgresql://db/orders", "--action", "Close", "--sequence", "order", "--context-id", "o-1"}, "seqinbox action: --database-url jdbc:postgresql://…: seqinbox keeps the inbox in PostgreSQL"},
		{[]string{"migrate", "--database-url", "postgres://x", "--live-within", "0s"}, "seqinbox migrate: --live-within 0s: must be positive"},
		{[]string{"action", "--database-url", "postgres://x", "--action", "Close", "-o", "yaml"}, `seqinbox action: --output "yaml"`},
		{[]string{"action", "--database-url", "postgres://x", "--action", "Close"}, "seqinbox action: --action Close takes --sequence and --context-id"},
		{[]string{"consume"}, "seqinbox consume: -f inbox.yaml is required"},
		{[]string{"consume", "--nope"}, "seqinbox consume: unknown flag: --nope"},
		{[]string{"consume", "-f", "inbox.yaml", "extra"}, `seqinbox consume: takes no arguments, got "extra"`},
		{[]string{"consume", "--metrics-bind-address"}, "seqinbox consume: flag needs an argument: --metrics-bind-address"},
		{[]string{"deadletters", "bogus"}, `seqinbox deadletters: unknown command "bogus" for "seqinbox deadletters"`},
		{[]string{"deadletters", "retry"}, "seqinbox deadletters retry: -f inbox.yaml is required"},
		{[]string{"deadletters", "retry", "-f", "inbox.yaml", "--limit", "-1"}, "seqinbox deadletters retry: --limit -1: use 0 (all) or a positive number"},
		{[]string{"deadletters", "retry", "-f", "inbox.yaml", "--limit", "many"}, `seqinbox deadletters retry: invalid argument "many" for "--limit" flag`},
		{[]string{"deadletters", "retry", "-f", "inbox.yaml", "--filter-reason", "listenerfailed"}, `seqinbox deadletters retry: --filter-reason "listenerfailed": reasons are case-sensitive; use ListenerFailed`},
		{[]string{"deadletters", "retry", "-f", "inbox.yaml", "--filter-reason", "Timeout"}, `seqinbox deadletters retry: --filter-reason "Timeout": no dead letter has this reason; use one of FilterError, `},
		{[]string{"deadletters", "list"}, "seqinbox deadletters list: -f inbox.yaml is required"},
		{[]string{"deadletters", "list", "-f", "inbox.yaml", "--reason", "listenerfailed"}, `seqinbox deadletters list: --reason "listenerfailed": reasons are case-sensitive; use ListenerFailed`},
		{[]string{"deadletters", "list", "-f", "inbox.yaml", "--reason", "Timeout"}, `seqinbox deadletters list: --reason "Timeout": no dead letter has this reason; use one of FilterError, `},
		{[]string{"deadletters", "list", "-f", "inbox.yaml", "--since", "yesterday"}, `seqinbox deadletters list: --since "yesterday": use a duration back from now (1h, 30m) or an RFC 3339 time`},
		{[]string{"deadletters", "list", "-f", "inbox.yaml", "--since", "-1h"}, `seqinbox deadletters list: --since -1h: use a positive duration`},
		{[]string{"deadletters", "list", "-f", "inbox.yaml", "-o", "csv"}, `seqinbox deadletters list: --output "csv": use text, json or yaml`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			stdout, stderr, code := seqinbox(t, tt.args...)
			if code != cli.ExitUsage {
				t.Fatalf("exit %d, want %d (usage); stderr:\n%s", code, cli.ExitUsage, stderr)
			}
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[0], tt.want) || !strings.HasPrefix(lines[1], "Run 'seqinbox") {
				t.Fatalf("stderr:\n%s\nwant one line starting %q, then where to find the usage", stderr, tt.want)
			}
			if stdout != "" {
				t.Fatalf("wrote %q to stdout", stdout)
			}
		})
	}
}

func TestFailuresOfARunningCommandExitOne(t *testing.T) {
	_, stderr, code := seqinbox(t, "consume", "-f", filepath.Join(t.TempDir(), "missing.yaml"))
	if code != cli.ExitFailed || !strings.Contains(stderr, "missing.yaml") || strings.Contains(stderr, "--help") {
		t.Fatalf("consume of a missing manifest: exit %d, stderr %q; want 1, naming the file, without a usage hint", code, stderr)
	}
}

func TestServingFlagsHaveKubebuilderNamesAndTheOldNamesStillWork(t *testing.T) {
	for _, cmd := range []*cobra.Command{newOperatorCommand(), newConsumeCommand()} {
		for _, name := range []string{"metrics-bind-address", "health-probe-bind-address"} {
			if cmd.Flags().Lookup(name) == nil {
				t.Errorf("%s has no --%s", cmd.Name(), name)
			}
		}
	}
	consume := newConsumeCommand()
	if err := consume.ParseFlags([]string{"--metrics-addr", "127.0.0.1:9100", "--health-addr", "127.0.0.1:9101"}); err != nil {
		t.Fatal(err)
	}
	if m, h := consume.Flags().Lookup("metrics-bind-address").Value.String(), consume.Flags().Lookup("health-probe-bind-address").Value.String(); m != "127.0.0.1:9100" || h != "127.0.0.1:9101" {
		t.Fatalf("--metrics-addr, --health-addr set (%q, %q), want the addresses of the new names", m, h)
	}
	stdout, _, _ := seqinbox(t, "consume", "--help")
	if strings.Contains(stdout, "--metrics-addr") || strings.Contains(stdout, "--health-addr") {
		t.Fatalf("consume --help lists the deprecated names:\n%s", stdout)
	}
}

func TestConsumeDefaultsLetTwoConsumersShareAHost(t *testing.T) {
	consume := newConsumeCommand()
	for _, name := range []string{"metrics-bind-address", "health-probe-bind-address"} {
		if def := consume.Flags().Lookup(name).DefValue; def != "127.0.0.1:0" {
			t.Errorf("--%s defaults to %q, want the loopback interface and a port the kernel picks", name, def)
		}
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	a, b := defaultInstanceID(), defaultInstanceID()
	if a == b || !strings.HasPrefix(a, strings.ToLower(host)+"-") {
		t.Fatalf("default instance ids %q and %q, want two distinct ids starting with the host name %q", a, b, host)
	}
}

func TestHelpNeverPrintsTheDatabaseURLOfTheEnvironment(t *testing.T) {
	const password = "s3cret-pw"
	t.Setenv(envDatabaseURL, "postgres://app:"+password+"@db/orders")
	root := newRootCommand()
	for _, path := range commandPaths(root, nil) {
		stdout, stderr, _ := seqinbox(t, append(path, "--help")...)
		if strings.Contains(stdout+stderr, password) {
			t.Errorf("seqinbox %v --help prints the password of %s:\n%s%s", path, envDatabaseURL, stdout, stderr)
		}
	}
}

func TestInvalidManifestErrorsComeOneFieldPerLine(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	sample, err := os.ReadFile(filepath.Join(root, "config", "samples", "inbox_v1alpha1_sequentialinbox.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.NewReplacer("predecessor: OrderPaid", "predecessor: OrderUnpaid", "predecessor: OrderShipped", "predecessor: OrderNope").Replace(string(sample))
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}

	_, stderr, code := seqinbox(t, "consume", "-f", path, "--database-url", "postgres://127.0.0.1/none")
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	if code != cli.ExitFailed || len(lines) != 3 || !strings.HasPrefix(lines[0], "seqinbox consume: "+path+": ") {
		t.Fatalf("exit %d, stderr:\n%s\nwant 1, a line naming the file, then one line per invalid field", code, stderr)
	}
	for i, field := range []string{"spec.sequences[0].messages[3].releaseCondition.and[0].predecessor: ", "spec.sequences[0].messages[4].releaseCondition.predecessor: "} {
		if !strings.HasPrefix(lines[i+1], "  "+field) {
			t.Errorf("line %d = %q, want it to start with %q", i+2, lines[i+1], field)
		}
	}
}

// TestConsumeRefusesWhatTheAPIServerRefusesWithEveryFieldPath runs consume on manifests that
// kubectl apply would fail: the CRD's schema and CEL rules apply locally, every error is reported
// on its own line with its field path, unknown fields too, and none in terms of JSON.
func TestConsumeRefusesWhatTheAPIServerRefusesWithEveryFieldPath(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	sample, err := os.ReadFile(filepath.Join(root, "config", "samples", "inbox_v1alpha1_sequentialinbox.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		replacer *strings.Replacer
		want     []string
	}{
		{"everything at once", strings.NewReplacer(
			"name: order-inbox\n", "name: order-inbox-with-a-name-of-fifty-two-characters\n",
			"releaseCondition:\n            predecessor: OrderShipped", "releaseCondtion:\n            predecessor: OrderShipped",
			"retention: 168h", "retention: 10s",
			"    url: ", "    service: {name: order-service}\n    url: "), []string{
			"spec.sequences[0].messages[4].releaseCondtion: unknown field",
			"metadata.name must be a DNS label of at most 40 characters",
			"spec.sequences[0].retention: Invalid value: \"10s\"",
			"spec.sink: Invalid value: set exactly one of spec.sink.url and spec.sink.service",
		}},
		{"no sink", strings.NewReplacer("    url: http://127.0.0.1:8090/events\n", ""), []string{
			"spec.sink: Invalid value: set exactly one of spec.sink.url and spec.sink.service",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := tt.replacer.Replace(string(sample))
			if bad == string(sample) {
				t.Fatal("the replacements changed nothing in the sample")
			}
			path := filepath.Join(t.TempDir(), "bad.yaml")
			if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
				t.Fatal(err)
			}
			_, stderr, code := seqinbox(t, "consume", "-f", path, "--database-url", "postgres://127.0.0.1/none")
			// One error follows the file on its line; several come one per line after it.
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			wantLines, prefix := len(tt.want)+1, "  "
			if len(tt.want) == 1 {
				wantLines, prefix = 1, "seqinbox consume: manifest "+path+": document 1 (SequentialInbox order-inbox): "
			}
			if code != cli.ExitFailed || len(lines) != wantLines || strings.Contains(stderr, "json") {
				t.Fatalf("exit %d, stderr:\n%s\nwant 1, a line naming the file, then one line per error: %q", code, stderr, tt.want)
			}
			for _, want := range tt.want {
				if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix+want) }) {
					t.Errorf("no line starts with %q:\n%s", want, stderr)
				}
			}
		})
	}
}

// TestDatabaseErrorsSayWhatToDoOnce checks the errors of a database that cannot serve: a refused
// connection is reported once (pgx tries with and without TLS), and a search_path whose schemas
// do not exist says so, without a raw SQLSTATE.
func TestDatabaseErrorsSayWhatToDoOnce(t *testing.T) {
	_, stderr, code := seqinbox(t, "migrate", "--database-url", "postgres://app@127.0.0.1:1/orders")
	if code != cli.ExitFailed || strings.Count(stderr, "connection refused") != 1 {
		t.Errorf("migrate on a refused port: exit %d, stderr:\n%s\nwant 1 and the refused connection once", code, stderr)
	}

	url := testenv.FreshDatabase(t, "cmd_search_path")
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	_, stderr, code = seqinbox(t, "migrate", "--database-url", url+sep+"search_path=inbox")
	if code != cli.ExitFailed || !strings.Contains(stderr, "no schema of search_path (inbox) exists") || !strings.Contains(stderr, "CREATE SCHEMA") || strings.Contains(stderr, "SQLSTATE") {
		t.Errorf("migrate with a search_path of no schema: exit %d, stderr:\n%s\nwant 1, naming search_path and what to do, no SQLSTATE", code, stderr)
	}
}

func TestActionOnAnUnmigratedDatabaseSaysToRunMigrate(t *testing.T) {
	url := testenv.FreshDatabase(t, "cmd_action_unmigrated")

	_, stderr, code := seqinbox(t, "action", "--database-url", url, "--action", "Close", "--sequence", "order", "--context-id", "o-1")
	if code != cli.ExitFailed || !strings.Contains(stderr, "run `seqinbox migrate`") || strings.Contains(stderr, "SQLSTATE") {
		t.Fatalf("exit %d, stderr %q; want 1 and the hint to run seqinbox migrate, no SQL error", code, stderr)
	}
}

func TestTheBinaryExitsWithTheDocumentedCodes(t *testing.T) {
	bin := testenv.BuildSeqinbox(t)
	tests := []struct {
		args       []string
		code       int
		stderrHas  string
		stdoutHas  string
		stderrLine bool
	}{
		{[]string{"--help"}, cli.ExitOK, "", "Usage:", false},
		{[]string{"help", "consume"}, cli.ExitOK, "", "seqinbox consume -f inbox.yaml", false},
		{[]string{"completion", "bash"}, cli.ExitOK, "", "bash completion", false},
		{[]string{"version", "extra"}, cli.ExitUsage, "takes no arguments", "", false},
		// Without any cluster configuration the operator says what to do, in one line, no stack trace.
		{[]string{"operator"}, cli.ExitFailed, "seqinbox operator: no Kubernetes cluster configured: pass --kubeconfig", "", true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.code || !strings.Contains(stderr.String(), tt.stderrHas) || !strings.Contains(stdout.String(), tt.stdoutHas) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					code, stdout.String(), stderr.String(), tt.code, tt.stdoutHas, tt.stderrHas)
			}
			if tt.stderrLine && strings.Count(stderr.String(), "\n") != 1 {
				t.Fatalf("stderr has %d lines, want exactly one:\n%s", strings.Count(stderr.String(), "\n"), stderr.String())
			}
		})
	}
}

func TestTheReleaseBinaryLinksNoDevelopmentCommandsAndNoEmbeddedBroker(t *testing.T) {
	bin := testenv.BuildSeqinbox(t)

	err := exec.Command(bin, "demo").Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != cli.ExitUsage {
		t.Fatalf("release binary: seqinbox demo ended with %v, want exit %d (unknown command)", err, cli.ExitUsage)
	}
	symbols, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	for _, pkg := range []string{"github.com/twmb/franz-go/pkg/kfake.", "github.com/seqinbox/seqinbox/internal/demo."} {
		if bytes.Contains(symbols, []byte(pkg)) {
			t.Errorf("the release binary links %s", strings.TrimSuffix(pkg, "."))
		}
	}
	if !bytes.Contains(symbols, []byte("github.com/twmb/franz-go/pkg/kgo.")) {
		t.Fatal("no franz-go client symbols either: the symbol table is not what this test expects")
	}
}
