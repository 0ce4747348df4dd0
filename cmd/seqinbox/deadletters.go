package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/seqinbox/seqinbox/internal/consumer"
	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/manifest"
)

func init() {
	commands["deadletters"] = command{summary: "work with the dead-letter topic: `deadletters retry` re-publishes dead letters", run: runDeadLetters}
}

func runDeadLetters(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "retry" {
		fmt.Fprintln(os.Stderr, "Usage: seqinbox deadletters retry -f inbox.yaml [--bootstrap-servers host:port,...] [--limit N] [--filter-reason REASON]")
		return errUsage
	}
	fs := flag.NewFlagSet("deadletters retry", flag.ContinueOnError)
	file := fs.String("f", "", "SequentialInbox manifest (required)")
	bootstrap := fs.String("bootstrap-servers", os.Getenv(envBootstrapServers), "comma-separated Kafka brokers (env "+envBootstrapServers+"); replaces spec.kafka.bootstrapServers")
	limit := fs.Int("limit", 0, "re-publish at most this many dead letters (0: all)")
	reason := fs.String("filter-reason", "", "re-publish only dead letters of this reason (seqinbox-dlq-reason, e.g. ListenerFailed)")
	if err := fs.Parse(args[1:]); err != nil {
		return errUsage
	}
	if *file == "" || *limit < 0 {
		fs.Usage()
		return errUsage
	}
	inbox, err := manifest.Load(*file)
	if err != nil {
		return err
	}
	k := consumer.Kafka{Username: os.Getenv(envKafkaUsername), Password: os.Getenv(envKafkaPassword), CAFile: os.Getenv(envKafkaCAFile)}
	if *bootstrap != "" {
		k.BootstrapServers = strings.Split(*bootstrap, ",")
	}
	conn, err := consumer.ConnectionOptions(&inbox.Spec.Kafka, k)
	if err != nil {
		return err
	}
	opts := deadletter.RetryOptions{
		Topic:  manifest.DeadLetterTopic(&inbox.Spec),
		Group:  deadletter.RetryGroup(inbox.Spec.Kafka.ConsumerGroup, *reason),
		Reason: *reason,
		Limit:  *limit,
	}
	rep, err := deadletter.Retry(ctx, conn, opts)
	printRetryReport(opts, rep)
	return err
}

func printRetryReport(opts deadletter.RetryOptions, rep deadletter.RetryReport) {
	fmt.Printf("re-published %d dead letter(s) from %s (position kept in group %s)\n", rep.Total(), opts.Topic, opts.Group)
	reasons := make([]string, 0, len(rep.Republished))
	for r := range rep.Republished {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Printf("  %-24s %d\n", r, rep.Republished[r])
	}
	if rep.Skipped > 0 {
		fmt.Printf("passed over %d dead letter(s) of other reasons\n", rep.Skipped)
	}
	if rep.Unroutable > 0 {
		fmt.Printf("passed over %d record(s) without %s header\n", rep.Unroutable, deadletter.HeaderOriginalTopic)
	}
}
