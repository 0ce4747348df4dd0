// Package demo runs the whole claim engine locally on embedded defaults (`make demo`,
// docs/design.md#development-environment): an embedded Kafka broker, a temporary PostgreSQL
// database, a sink that records what it receives, and two `seqinbox consume` processes of the
// sample declaration in different consumer groups, so that every record reaches the claim engine
// twice, concurrently. It sends orders whose events arrive out of order, duplicated, filtered,
// rejected once and poisoned, and judges what the sink received against the declaration's release
// conditions.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/manifest"
)

// Options configure a demo run.
type Options struct {
	// Binary is the seqinbox binary the consumers run (`<Binary> consume`).
	Binary string
	// DatabaseURL points at the PostgreSQL server (any database of it) on which the demo creates
	// its temporary database.
	DatabaseURL string
	// Manifest is the SequentialInbox file the consumers run, the sample in `make demo`.
	Manifest string
	// Out receives the progress lines.
	Out io.Writer
	// Timeout bounds how long the consumers may take to process the scenario.
	Timeout time.Duration
}

// progressEvery is how often the wait for the consumers prints where it stands.
const progressEvery = time.Second

// Run runs the demo and returns its report. An error means the demo could not run (or was
// interrupted); whether the product kept its promise is the report's Verdict. Everything Run
// starts (broker, sink, consumers, database) is stopped and removed before it returns, also when
// ctx is cancelled.
func Run(ctx context.Context, opts Options) (report *Report, err error) {
	started := time.Now()
	step := func(format string, args ...any) {
		// Progress is best effort: a closed terminal must not stop the demo's cleanup.
		_, _ = fmt.Fprintf(opts.Out, "demo %5.1fs  %s\n", time.Since(started).Seconds(), fmt.Sprintf(format, args...))
	}

	manifestData, err := os.ReadFile(opts.Manifest)
	if err != nil {
		return nil, fmt.Errorf("read the manifest: %w", err)
	}
	inbox, err := manifest.Parse(manifestData)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", opts.Manifest, err)
	}
	set, errs := declaration.Compile(&inbox.Spec)
	if len(errs) > 0 {
		return nil, fmt.Errorf("manifest %s: %w", opts.Manifest, errs.ToAggregate())
	}
	if len(inbox.Spec.Kafka.Topics) != 1 {
		return nil, fmt.Errorf("manifest %s: the demo sends to one topic, the manifest reads %d", opts.Manifest, len(inbox.Spec.Kafka.Topics))
	}
	sc := OrderScenario(inbox.Spec.Kafka.Topics[0])
	dlqTopic := manifest.DeadLetterTopic(&inbox.Spec)
	step("SequentialInbox %s from %s", inbox.Name, opts.Manifest)
	for _, seq := range set.Sequences() {
		var rules []string
		for _, t := range seq.Types {
			rule := t.Qualified
			if t.Condition != nil {
				rule += " after " + t.Condition.String()
			}
			rules = append(rules, rule)
		}
		step("  sequence %s: %s", seq.Name, strings.Join(rules, "; "))
	}

	cluster, err := StartBroker(0, Topic{Name: sc.Topic, Partitions: sc.Partitions}, Topic{Name: dlqTopic, Partitions: 1})
	if err != nil {
		return nil, err
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()
	step("embedded Kafka broker (kfake) on %s: topic %s (%d partitions), dead-letter topic %s",
		strings.Join(seeds, ","), sc.Topic, sc.Partitions, dlqTopic)

	db, err := createDatabase(ctx, opts.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer func() {
		if dropErr := db.drop(); dropErr != nil {
			err = errors.Join(err, dropErr)
		} else {
			step("dropped database %s", db.Name)
		}
	}()
	version, err := db.migrate(ctx)
	if err != nil {
		return nil, err
	}
	step("temporary database %s, migrated to schema version %d", db.Name, version)

	sink, err := StartSink(sc.RejectOnce)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, sink.Close()) }()
	step("demo sink at %s (answers 500 to %s the first time)", strings.TrimSuffix(sink.URL(""), "?via="), sc.RejectOnce)

	dir, err := os.MkdirTemp("", "seqinbox-demo-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()

	consumers, err := startConsumers(ctx, opts, manifestData, inbox.Spec.Kafka.ConsumerGroup, dir, db.URL, seeds, sink, step)
	defer func() {
		for _, c := range consumers {
			if stopErr := c.stop(); stopErr != nil {
				err = errors.Join(err, stopErr)
			}
		}
	}()
	if err != nil {
		return nil, err
	}

	if err := Produce(ctx, seeds, sc); err != nil {
		return nil, err
	}
	events, poison := 0, 0
	for _, s := range sc.Sends {
		if s.Poison != nil {
			poison++
		} else {
			events++
		}
	}
	step("produced %d records (%d events, duplicates included, and %d poison records) in the order the report shows",
		len(sc.Sends), events, poison)

	groups := make([]string, len(consumers))
	for i, c := range consumers {
		groups[i] = c.Group
	}
	if err := awaitProcessed(ctx, opts.Timeout, seeds, sc, sink, consumers, groups, step); err != nil {
		return nil, err
	}

	report = &Report{Scenario: sc, Counters: engineCounters(), Database: db.Name, DeadLetterTopic: dlqTopic}
	for _, c := range consumers {
		families, err := Scrape(ctx, "http://"+c.MetricsAddr+"/metrics")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		stats := ConsumerStats{Name: c.Name, Group: c.Group}
		for _, counter := range report.Counters {
			stats.Values = append(stats.Values, counter.Value(families))
		}
		report.Consumers = append(report.Consumers, stats)
	}
	report.DeadLetters, err = ReadDeadLetters(ctx, seeds, dlqTopic)
	if err != nil {
		return nil, err
	}
	report.Deliveries = sink.Deliveries()
	report.Verdict = Check(set, sc, report.Deliveries, report.DeadLetters, len(consumers))
	report.Elapsed = time.Since(started)
	return report, nil
}

// startConsumers writes a manifest copy per consumer and starts them; it returns the consumers
// it started (to be stopped by the caller) also when one of them fails.
func startConsumers(ctx context.Context, opts Options, manifestData []byte, group, dir, databaseURL string,
	seeds []string, sink *Sink, step func(string, ...any)) ([]*consumer, error) {
	var consumers []*consumer
	// Two consumers, each in its own consumer group, so that every record reaches the engine twice.
	for _, name := range []string{"a", "b"} {
		group, instance := group+"-"+name, "consumer-"+name
		path := filepath.Join(dir, "inbox-"+name+".yaml")
		if err := consumerCopy(manifestData, path, group, sink.URL(instance), seeds); err != nil {
			return consumers, err
		}
		c, err := startConsumer(opts.Binary, path, databaseURL, seeds, instance, group, filepath.Join(dir, instance+".log"))
		if err != nil {
			return consumers, err
		}
		consumers = append(consumers, c)
		step("started %s consume -f %s (consumer group %s, metrics on %s)", filepath.Base(opts.Binary), path, group, c.MetricsAddr)
	}
	for _, c := range consumers {
		if err := c.waitReady(ctx); err != nil {
			return consumers, err
		}
	}
	step("consumers ready (/readyz: schema checked, version fence passed)")
	return consumers, nil
}

// awaitProcessed waits until every consumer group has committed every record of the topic,
// printing progress, or until the timeout, a consumer's exit, or ctx ends the wait.
func awaitProcessed(ctx context.Context, timeout time.Duration, seeds []string, sc *Scenario, sink *Sink,
	consumers []*consumer, groups []string, step func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(progressEvery / 5)
	defer ticker.Stop()
	lastPrint := time.Time{}
	for {
		for _, c := range consumers {
			if c.exited() {
				return fmt.Errorf("%s exited while processing (%w); its log:\n%s", c.Name, c.exitReason(), c.logTail(20))
			}
		}
		left, err := Unprocessed(ctx, seeds, sc.Topic, groups)
		if err != nil && ctx.Err() == nil {
			return err
		}
		done := err == nil
		var status []string
		for _, g := range groups {
			status = append(status, fmt.Sprintf("%s %d", g, left[g]))
			done = done && left[g] == 0
		}
		accepted := 0
		for _, d := range sink.Deliveries() {
			if d.Accepted() {
				accepted++
			}
		}
		if done || time.Since(lastPrint) >= progressEvery {
			step("sink accepted %d messages; records not yet committed: %s", accepted, strings.Join(status, ", "))
			lastPrint = time.Now()
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); errors.Is(cause, context.DeadlineExceeded) {
				var logs []string
				for _, c := range consumers {
					logs = append(logs, fmt.Sprintf("%s:\n%s", c.Name, c.logTail(15)))
				}
				return fmt.Errorf("the consumers did not process the scenario within %s; their logs:\n%s", timeout, strings.Join(logs, "\n"))
			}
			return ctx.Err()
		case <-ticker.C:
		}
	}
}
