package plugin

import (
	"slices"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/seqinbox/seqinbox/internal/cli"
)

// deadLettersSince is the first release whose image has `seqinbox deadletters list` and `retry`.
const deadLettersSince = "v0.1.0"

// The verbs of `deadletters NAME VERB`, and the flags each takes besides -o.
var deadLetterVerbs = map[string][]string{
	"list":  {"reason", "since", "output"},
	"retry": {"filter-reason", "limit"},
}

func newDeadLettersCommand(e *env) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "deadletters NAME list|retry",
		Short: "List or retry an inbox's dead letters, with the inbox's own image and credentials",
		Long: `List the dead letters of an inbox (when each failed, its reason, the original topic, partition
and offset, its type and idempotence ID, never the payload), or re-publish them to their
original topics. The command runs as 'seqinbox deadletters list|retry' in a ready consumer pod of
the inbox (kubectl exec), so the inbox's own image reaches Kafka with the pod's own credentials
and no Secret leaves the cluster. This needs the right to create pods/exec in the namespace.

list takes --reason (one reason, case-sensitive), --since (a duration back from now, as 1h, or
an RFC 3339 time) and -o json|yaml. retry takes --filter-reason and --limit and keeps its
position in its own consumer group, as 'seqinbox deadletters retry' does. The exit code is the
command's.`,
		Example: `  # The dead letters of the last hour
  kubectl seqinbox deadletters order-inbox list --since 1h

  # The undecodable records, for a script
  kubectl seqinbox deadletters order-inbox list --reason InvalidJSON -o json

  # Re-publish at most 10 dead letters whose sink call failed
  kubectl seqinbox deadletters order-inbox retry --filter-reason ListenerFailed --limit 10`,
		Args:              deadLettersArgs,
		ValidArgsFunction: e.completeDeadLetters,
		RunE: func(cmd *cobra.Command, args []string) error {
			verb := args[1]
			if err := checkVerbFlags(cmd.Flags(), verb); err != nil {
				return err
			}
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := e.connect()
			if err != nil {
				return err
			}
			inbox, err := c.inbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			pc := deadLettersPodCommand(cmd.Flags(), verb)
			code, err := execInConsumer(cmd.Context(), c, inbox, pc, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return cli.Exited(code)
		},
	}
	addOutputFlag(cmd, &output)
	cmd.Flags().String("reason", "", "list: only dead letters of this reason (e.g. InvalidJSON, ListenerFailed)")
	cmd.Flags().String("since", "", "list: only dead letters from this time on: a duration back from now (1h, 30m) or an RFC 3339 time")
	cmd.Flags().String("filter-reason", "", "retry: re-publish only dead letters of this reason")
	cmd.Flags().Int("limit", 0, "retry: re-publish at most this many dead letters (0: all)")
	return cmd
}

// deadLettersPodCommand is `seqinbox deadletters VERB` of the pod's manifest with the flags of
// verb that the command line set, in the order of the flag set.
func deadLettersPodCommand(flags *pflag.FlagSet, verb string) podCommand {
	pc := podCommand{Args: []string{"deadletters", verb, "-f", podManifest}, Since: deadLettersSince}
	flags.VisitAll(func(f *pflag.Flag) {
		if f.Changed && slices.Contains(deadLetterVerbs[verb], f.Name) {
			pc.Args = append(pc.Args, "--"+f.Name, f.Value.String())
		}
	})
	return pc
}

// deadLettersArgs accepts the inbox's name and a verb, list or retry.
func deadLettersArgs(_ *cobra.Command, args []string) error {
	if len(args) != 2 {
		return cli.UsageErrorf("takes the name of one SequentialInbox and list or retry, got %d arguments", len(args))
	}
	if _, ok := deadLetterVerbs[args[1]]; !ok {
		return cli.UsageErrorf("%q: use list or retry after the inbox's name", args[1])
	}
	return nil
}

// checkVerbFlags refuses a flag set on the command line that verb does not take.
func checkVerbFlags(flags *pflag.FlagSet, verb string) error {
	var err error
	flags.Visit(func(f *pflag.Flag) {
		for v, names := range deadLetterVerbs {
			if v != verb && err == nil && slices.Contains(names, f.Name) && !slices.Contains(deadLetterVerbs[verb], f.Name) {
				err = cli.UsageErrorf("--%s is a flag of %s, not of %s", f.Name, v, verb)
			}
		}
	})
	return err
}

// completeDeadLetters completes the inbox's name, then the verb.
func (e *env) completeDeadLetters(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) == 1 {
		return []string{"list", "retry"}, cobra.ShellCompDirectiveNoFileComp
	}
	if len(args) > 1 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return e.completeInboxes(cmd, args, toComplete)
}
