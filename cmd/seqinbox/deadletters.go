package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/consumer"
	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/manifest"
)

func newDeadLettersCommand() *cobra.Command {
	cmd := cli.GroupCommand(&cobra.Command{
		Use:   "deadletters",
		Short: "Work with the dead-letter topic of an inbox",
		Long: `Work with the dead-letter topic of an inbox. Every dead letter carries headers that say why it
is there and where it came from; 'deadletters list' shows them, 'deadletters retry' re-publishes
dead letters to their original topics, where the consumers claim them again as new deliveries.`,
		Example: `  seqinbox deadletters list -f inbox.yaml --bootstrap-servers localhost:9092
  seqinbox deadletters retry -f inbox.yaml --bootstrap-servers localhost:9092`,
	})
	cmd.AddCommand(newDeadLettersListCommand(), newDeadLettersRetryCommand())
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
			if err := checkReason("--filter-reason", reason); err != nil {
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

// checkReason refuses a reason (of the flag named flag) that no dead letter can carry: it would
// match nothing, and a retry would keep its position in a consumer group named after the typo.
func checkReason(flag, reason string) error {
	reasons := deadletter.Reasons()
	if reason == "" || slices.Contains(reasons, reason) {
		return nil
	}
	for _, r := range reasons {
		if strings.EqualFold(r, reason) {
			return cli.UsageErrorf("%s %q: reasons are case-sensitive; use %s", flag, reason, r)
		}
	}
	return cli.UsageErrorf("%s %q: no dead letter has this reason; use one of %s", flag, reason, strings.Join(reasons, ", "))
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

func newDeadLettersListCommand() *cobra.Command {
	var file, bootstrap, reason, since, output string
	cmd := &cobra.Command{
		Use:   "list -f inbox.yaml",
		Short: "List the dead letters of an inbox, without their payload",
		Long: `List the dead letters of the inbox's dead-letter topic: when each failed, the reason (header
seqinbox-dlq-reason), the original topic, partition and offset, and the message type and
idempotence ID as far as the record could be decoded; never the payload. The list reads the
letters that are in the topic when it starts, in the order they failed; it joins no consumer
group and commits nothing, so it changes nothing a retry or the consumers remember.

--since starts at the first letter of that time (a duration back from now, as 1h or 30m, or an
RFC 3339 time); --reason keeps the letters of one reason.`,
		Example: `  # Every dead letter
  seqinbox deadletters list -f inbox.yaml --bootstrap-servers localhost:9092

  # The undecodable records of the last hour, as JSON
  seqinbox deadletters list -f inbox.yaml --reason InvalidJSON --since 1h -o json`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireManifest(file); err != nil {
				return err
			}
			if err := checkDataOutput(output); err != nil {
				return err
			}
			if err := checkReason("--reason", reason); err != nil {
				return err
			}
			from, err := parseSince(since, time.Now())
			if err != nil {
				return err
			}
			fromEnv(cmd, "bootstrap-servers", envBootstrapServers, &bootstrap)
			inbox, err := manifest.Load(file)
			if err != nil {
				return err
			}
			set, errs := declaration.Compile(&inbox.Spec)
			if len(errs) > 0 {
				return fmt.Errorf("%s: invalid SequentialInbox %s: %w", file, inbox.Name, errs.ToAggregate())
			}
			dec, err := decode.New(set)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			conn, err := consumer.ConnectionOptions(&inbox.Spec.Kafka, kafkaFromEnv(bootstrap))
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			opts := deadletter.ListOptions{Topic: manifest.DeadLetterTopic(&inbox.Spec), Reason: reason, Since: from, Decoder: dec}
			entries, err := deadletter.List(cmd.Context(), conn, opts)
			if err != nil {
				return err
			}
			l := deadLetterList{Topic: opts.Topic, Reason: reason, DeadLetters: entries}
			if !from.IsZero() {
				l.Since = &from
			}
			if output != outputText {
				return writeData(cmd.OutOrStdout(), output, l)
			}
			return printDeadLetters(cmd.OutOrStdout(), l)
		},
	}
	addManifestFlag(cmd, &file, "", "SequentialInbox manifest (required)")
	addBootstrapServersFlag(cmd, &bootstrap)
	addDataOutputFlag(cmd, &output)
	cmd.Flags().StringVar(&reason, "reason", "", "list only dead letters of this reason (header seqinbox-dlq-reason, e.g. InvalidJSON)")
	cmd.Flags().StringVar(&since, "since", "", "list only dead letters from this time on: a duration back from now (1h, 30m) or an RFC 3339 time")
	_ = cmd.RegisterFlagCompletionFunc("reason", cobra.FixedCompletions(deadletter.Reasons(), cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// deadLetterList is what `deadletters list` prints, for -o json|yaml as for the text.
type deadLetterList struct {
	Topic       string             `json:"topic"`
	Reason      string             `json:"reason,omitempty"`
	Since       *time.Time         `json:"since,omitempty"`
	DeadLetters []deadletter.Entry `json:"deadLetters"`
}

// parseSince reads --since: empty is the start of the topic, a positive duration is that long
// before now, anything else must be an RFC 3339 time.
func parseSince(since string, now time.Time) (time.Time, error) {
	if since == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(since); err == nil {
		if d <= 0 {
			return time.Time{}, cli.UsageErrorf("--since %s: use a positive duration (1h, 30m) or an RFC 3339 time", since)
		}
		return now.Add(-d).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339, since)
	if err != nil {
		return time.Time{}, cli.UsageErrorf("--since %q: use a duration back from now (1h, 30m) or an RFC 3339 time (2026-12-01T08:00:00Z)", since)
	}
	return t.UTC(), nil
}

// printDeadLetters writes the list as a table, one dead letter a line.
func printDeadLetters(w io.Writer, l deadLetterList) error {
	var b strings.Builder
	scope := l.Topic
	if l.Reason != "" {
		scope += ", reason " + l.Reason
	}
	if l.Since != nil {
		scope += ", since " + l.Since.Format(time.RFC3339)
	}
	if len(l.DeadLetters) == 0 {
		fmt.Fprintf(&b, "no dead letters in %s\n", scope)
		_, err := io.WriteString(w, b.String())
		return err
	}
	fmt.Fprintf(&b, "%d dead letter(s) in %s\n", len(l.DeadLetters), scope)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "FAILED AT\tREASON\tORIGINAL\tTYPE\tIDEMPOTENCE ID\tMESSAGE")
	for _, e := range l.DeadLetters {
		message := strings.Join(strings.Fields(e.Message), " ")
		if e.Omitted != "" {
			message = strings.TrimSpace(message + " (stored without " + e.Omitted + ")")
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s[%d]@%d\t%s\t%s\t%s\n", e.FailedAt.Format(time.RFC3339), e.Reason, e.Topic, e.Partition, e.Offset,
			cmp.Or(e.Type, "-"), cmp.Or(e.IdempotenceID, "-"), cmp.Or(message, "-"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}
