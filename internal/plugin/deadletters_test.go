package plugin

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/seqinbox/seqinbox/internal/cli"
)

// The command line in the pod is the image's `seqinbox deadletters VERB` of the pod's manifest
// with the flags the user set for that verb, and no other.
func TestDeadLettersRunsTheImagesCommandWithTheFlagsOfItsVerb(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"order-inbox", "list"}, []string{"deadletters", "list", "-f", podManifest}},
		{[]string{"order-inbox", "list", "--reason", "InvalidJSON", "--since", "1h", "-o", "json"},
			[]string{"deadletters", "list", "-f", podManifest, "--output", "json", "--reason", "InvalidJSON", "--since", "1h"}},
		{[]string{"order-inbox", "retry", "--filter-reason", "ListenerFailed", "--limit", "10"},
			[]string{"deadletters", "retry", "-f", podManifest, "--filter-reason", "ListenerFailed", "--limit", "10"}},
	} {
		cmd := newDeadLettersCommand(&env{})
		must(t, cmd.ParseFlags(tc.args))
		pc := deadLettersPodCommand(cmd.Flags(), cmd.Flags().Arg(1))
		if !slices.Equal(pc.Args, tc.want) || pc.Since != deadLettersSince {
			t.Errorf("%q runs %q (since %s), want %q", tc.args, pc.Args, pc.Since, tc.want)
		}
	}
}

func TestDeadLettersRefusesAFlagOfTheOtherVerb(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"deadletters", "order-inbox"}, "kubectl seqinbox deadletters: takes the name of one SequentialInbox and list or retry, got 1 arguments"},
		{[]string{"deadletters", "order-inbox", "purge"}, `kubectl seqinbox deadletters: "purge": use list or retry after the inbox's name`},
		{[]string{"deadletters", "order-inbox", "list", "--limit", "3"}, "kubectl seqinbox deadletters: --limit is a flag of retry, not of list"},
		{[]string{"deadletters", "order-inbox", "retry", "--reason", "InvalidJSON"}, "kubectl seqinbox deadletters: --reason is a flag of list, not of retry"},
		{[]string{"deadletters", "order-inbox", "retry", "-o", "json"}, "kubectl seqinbox deadletters: --output is a flag of list, not of retry"},
		{[]string{"deadletters", "order-inbox", "list", "-o", "csv"}, `kubectl seqinbox deadletters: --output "csv": use json or yaml`},
	} {
		r := pluginWithoutCluster(t, tc.args...)
		if r.code != cli.ExitUsage || !strings.HasPrefix(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

func TestDeadLettersOfAnInboxWithoutReadyConsumerSaysSo(t *testing.T) {
	ns := namespace(t, "deadletters-none-ready")
	createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
	r := plugin(t, testNow, "", "deadletters", "order-inbox", "list", "-n", ns)
	want := "kubectl seqinbox deadletters: SequentialInbox " + ns + "/order-inbox has no ready consumer pod (of 0) to run the command in"
	if r.code != cli.ExitFailed || !strings.HasPrefix(r.stderr, want) {
		t.Fatalf("exit %d, stderr %q; want exit 1 and %q", r.code, r.stderr, want)
	}
}

func TestDeadLettersCompletesTheInboxThenTheVerb(t *testing.T) {
	ns := namespace(t, "deadletters-completion")
	createInbox(t, ns, "order-inbox", nil, nil)
	r := plugin(t, testNow, "", cobra.ShellCompRequestCmd, "deadletters", "-n", ns, "")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "order-inbox\n:4\n") {
		t.Errorf("completion of the inbox: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = plugin(t, testNow, "", cobra.ShellCompRequestCmd, "deadletters", "order-inbox", "")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "list\nretry\n:4\n") {
		t.Errorf("completion of the verb: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
