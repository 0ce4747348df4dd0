package plugin

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/seqinbox/seqinbox/internal/cli"
)

// commandPaths lists every command of the tree as its arguments (["consume-all"]).
func commandPaths(cmd *cobra.Command, parent []string) [][]string {
	var paths [][]string
	for _, sub := range cmd.Commands() {
		path := append(append([]string{}, parent...), sub.Name())
		paths = append(paths, path)
		paths = append(paths, commandPaths(sub, path)...)
	}
	return paths
}

// pluginWithoutCluster runs a command line with no kubeconfig anywhere.
func pluginWithoutCluster(t *testing.T, args ...string) result {
	t.Helper()
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	var out, errOut bytes.Buffer
	err := cli.Run(context.Background(), NewRootCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}), args, &out, &errOut)
	if err != nil {
		cli.PrintError(&errOut, err)
	}
	return result{out.String(), errOut.String(), cli.ExitCode(err)}
}

func TestHelpOfEveryCommandExitsZeroWithDescriptionAndExample(t *testing.T) {
	root := NewRootCommand(genericiooptions.NewTestIOStreamsDiscard())
	paths := append([][]string{nil}, commandPaths(root, nil)...)
	for _, want := range []string{"status", "inspect", "consume", "expire", "consume-all", "close", "approve", "report"} {
		if !slices.ContainsFunc(paths, func(p []string) bool { return len(p) == 1 && p[0] == want }) {
			t.Fatalf("no command %s in %v", want, paths)
		}
	}
	for _, path := range paths {
		cmd, _, err := root.Find(path)
		must(t, err)
		name := strings.Join(append([]string{DisplayName}, path...), " ")
		if len(path) > 0 && (path[0] == "completion" || path[0] == "help") {
			continue // cobra's own
		}
		t.Run(name, func(t *testing.T) {
			if cmd.Short == "" || cmd.Long == "" || cmd.Example == "" {
				t.Fatalf("%s lacks a summary, a description or an example", name)
			}
			for _, args := range [][]string{append(path, "--help"), append(path, "-h"), append([]string{"help"}, path...)} {
				r := pluginWithoutCluster(t, args...)
				if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Examples:\n"+cmd.Example) ||
					!strings.Contains(r.stdout, "Usage:\n  "+name) || !strings.Contains(r.stdout, "--kubeconfig string") {
					t.Fatalf("%q: exit %d, stderr %q, stdout:\n%s", args, r.code, r.stderr, r.stdout)
				}
			}
		})
	}
}

func TestKubectlsFlagsAndExitCodesAreSeqinboxs(t *testing.T) {
	tests := []struct {
		args    []string
		code    int
		has     string
		channel string
	}{
		{[]string{"--version"}, cli.ExitOK, "kubectl seqinbox ", "stdout"},
		{[]string{"completion", "bash"}, cli.ExitOK, "bash completion", "stdout"},
		{[]string{"completion", "zsh"}, cli.ExitOK, "#compdef kubectl-seqinbox", "stdout"},
		{[]string{"status"}, cli.ExitUsage, "kubectl seqinbox status: takes the name of one SequentialInbox, got 0 arguments\nRun 'kubectl seqinbox status --help' for usage.\n", "stderr"},
		{[]string{"status", "a", "--no-such-flag"}, cli.ExitUsage, "unknown flag: --no-such-flag", "stderr"},
		{[]string{"unknown-command"}, cli.ExitUsage, `unknown command "unknown-command" for "kubectl seqinbox"`, "stderr"},
		{[]string{"report", "a", "--since", "soon"}, cli.ExitUsage, `invalid argument "soon" for "--since"`, "stderr"},
		// Without any cluster configuration it says what to do, in one line.
		{[]string{"status", "order-inbox"}, cli.ExitFailed, "kubectl seqinbox status: no Kubernetes cluster configured: pass --kubeconfig, set KUBECONFIG or create ~/.kube/config, as for kubectl\n", "stderr"},
	}
	for _, tt := range tests {
		r := pluginWithoutCluster(t, tt.args...)
		got := map[string]string{"stdout": r.stdout, "stderr": r.stderr}[tt.channel]
		if r.code != tt.code || !strings.Contains(got, tt.has) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d and %s with %q", tt.args, r.code, r.stdout, r.stderr, tt.code, tt.channel, tt.has)
		}
	}
	// -n, --context and --kubeconfig are kubectl's: a context of the kubeconfig that does not
	// exist is refused as kubectl refuses it.
	r := plugin(t, testNow, "", "status", "order-inbox", "--context", "elsewhere")
	if r.code != 1 || !strings.Contains(r.stderr, `read the kubeconfig: context "elsewhere" does not exist`) {
		t.Errorf("--context elsewhere: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestCompletionOffersTheInboxesOfTheNamespace(t *testing.T) {
	ns := namespace(t, "completion")
	createInbox(t, ns, "order-inbox", nil, nil)
	createInbox(t, ns, "refund-inbox", nil, nil)
	for _, cmd := range []string{"status", "inspect", "consume", "approve", "report"} {
		r := plugin(t, testNow, "", cobra.ShellCompRequestCmd, cmd, "-n", ns, "")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "order-inbox\nrefund-inbox\n:4\n") {
			t.Errorf("completion of %s: exit %d, stdout %q, stderr %q", cmd, r.code, r.stdout, r.stderr)
		}
	}
	r := plugin(t, testNow, "", cobra.ShellCompRequestCmd, "status", "-n", "")
	if r.code != 0 || !strings.Contains(r.stdout, "completion\n") || !strings.Contains(r.stdout, "kube-system\n") {
		t.Errorf("completion of -n: exit %d, stdout %q", r.code, r.stdout)
	}
}

// TestCalledAsKubectlsCompletionBinaryItCompletes runs the command line that kubectl (1.26 and
// later) gives kubectl_complete-seqinbox for `kubectl seqinbox st<TAB>`.
func TestCalledAsKubectlsCompletionBinaryItCompletes(t *testing.T) {
	args := Args("/usr/local/bin/"+CompletionBinary, []string{"st"})
	r := pluginWithoutCluster(t, args...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "status\tShow an inbox on one screen\n") {
		t.Fatalf("%q: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
	}
	if got := Args("/usr/local/bin/kubectl-seqinbox", []string{"st"}); !slices.Equal(got, []string{"st"}) {
		t.Fatalf("as kubectl-seqinbox: %q", got)
	}
}
