package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/consumer"
	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/manifest"
)

func newDeadLettersCommand() *cobra.Command {
	cmd := cli.GroupCommand(&cobra.Command{
		Use:   "deadletters",
		Short: "Work with the dead-letter topic of an inbox",
		Long: `Work with the dead-letter topic of an inbox. Every dead letter carries headers that say why it
is there and where it came from; 'deadletters retry' re-publishes dead letters to their
original topics, where the consumers claim them again as new deliveries.`,
		Example: `  seqinbox deadletters retry -f inbox.yaml --bootstrap-servers localhost:9092`,
	})
	cmd.AddCommand(newDeadLettersRetryCommand())
	return cmd
}

func newDeadLettersRetryCommand() *cobra.Command {
	var (
		file, bootstrap, reason string
		limit                   int
	)
	cmd := &cobra.Command{
		Use:   "retry -f inbox.yaml",
		Short: "Re-publish dead letters to their original topics",
		Long: `Re-publish dead letters of the inbox's dead-letter topic to the topics they came from (header
seqinbox-dlq-original-topic), with their original key and value. The position in the
dead-letter topic is kept in its own consumer group, so a second run re-publishes only newer
dead letters.`,
		Example: `  # Re-publish every dead letter
  seqinbox deadletters retry -f inbox.yaml --bootstrap-servers localhost:9092

  # Re-publish at most 10 dead letters whose sink call failed
  seqinbox deadletters retry -f inbox.yaml --filter-reason ListenerFailed --limit 10`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireManifest(file); err != nil {
				return err
			}
			if limit < 0 {
				return cli.UsageErrorf("--limit %d: use 0 (all) or a positive number", limit)
			}
			if err := checkFilterReason(reason); err != nil {
				return err
			}
			fromEnv(cmd, "bootstrap-servers", envBootstrapServers, &bootstrap)
			inbox, err := manifest.Load(file)
			if err != nil {
				return err
			}
			conn, err := consumer.ConnectionOptions(&inbox.Spec.Kafka, kafkaFromEnv(bootstrap))
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			opts := deadletter.RetryOptions{
				Topic:  manifest.DeadLetterTopic(&inbox.Spec),
				Group:  deadletter.RetryGroup(inbox.Spec.Kafka.ConsumerGroup, reason),
				Reason: reason,
				Limit:  limit,
			}
			rep, err := deadletter.Retry(cmd.Context(), conn, opts)
			if err != nil && rep.Total()+rep.Skipped+rep.Incomplete+rep.Unroutable == 0 {
				return err
			}
			return errors.Join(err, printRetryReport(cmd.OutOrStdout(), opts, rep))
		},
	}
	addManifestFlag(cmd, &file, "", "SequentialInbox manifest (required)")
	addBootstrapServersFlag(cmd, &bootstrap)
	cmd.Flags().IntVar(&limit, "limit", 0, "re-publish at most this many dead letters (0: all)")
	cmd.Flags().StringVar(&reason, "filter-reason", "", "re-publish only dead letters of this reason (header seqinbox-dlq-reason, e.g. ListenerFailed)")
	return cmd
}

// checkFilterReason refuses a --filter-reason that no dead letter can carry: it would match
// nothing and keep its position in a consumer group named after the typo.
func checkFilterReason(reason string) error {
	reasons := deadletter.Reasons()
	if reason == "" || slices.Contains(reasons, reason) {
		return nil
	}
	for _, r := range reasons {
		if strings.EqualFold(r, reason) {
			return cli.UsageErrorf("--filter-reason %q: reasons are case-sensitive; use %s", reason, r)
		}
	}
	return cli.UsageErrorf("--filter-reason %q: no dead letter has this reason; use one of %s", reason, strings.Join(reasons, ", "))
}

// printRetryReport writes what a retry re-published, by reason.
func printRetryReport(w io.Writer, opts deadletter.RetryOptions, rep deadletter.RetryReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "re-published %d dead letter(s) from %s (position kept in group %s)\n", rep.Total(), opts.Topic, opts.Group)
	reasons := make([]string, 0, len(rep.Republished))
	for r := range rep.Republished {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Fprintf(&b, "  %-24s %d\n", r, rep.Republished[r])
	}
	if rep.Skipped > 0 {
		fmt.Fprintf(&b, "passed over %d dead letter(s) of other reasons\n", rep.Skipped)
	}
	if rep.Incomplete > 0 {
		fmt.Fprintf(&b, "passed over %d letter(s) stored without their payload (%s); re-publish them from the original topic, partition and offset they name\n", rep.Incomplete, deadletter.HeaderOmitted)
	}
	if rep.Unroutable > 0 {
		fmt.Fprintf(&b, "passed over %d record(s) without %s header\n", rep.Unroutable, deadletter.HeaderOriginalTopic)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
