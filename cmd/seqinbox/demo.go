package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/seqinbox/seqinbox/internal/demo"
)

func init() {
	commands["demo"] = command{summary: "run the claim engine locally on embedded defaults and print a report (make demo)", run: runDemo}
	commands["dev"] = command{summary: "local development helpers: `dev kafka` runs an embedded Kafka broker", run: runDev}
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	databaseURL := fs.String("database-url", os.Getenv("SEQINBOX_DATABASE_URL"),
		"PostgreSQL server (any database of it) on which the demo creates and drops its temporary database (env SEQINBOX_DATABASE_URL)")
	manifestPath := fs.String("f", "config/samples/inbox_v1alpha1_sequentialinbox.yaml", "SequentialInbox manifest the consumers run")
	timeout := fs.Duration("timeout", time.Minute, "how long the consumers may take to process the scenario")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *databaseURL == "" {
		return errors.New("--database-url is required (make demo finds a server with hack/postgres.sh)")
	}
	binary, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the seqinbox binary for the consumers: %w", err)
	}
	report, err := demo.Run(ctx, demo.Options{
		Binary: binary, DatabaseURL: *databaseURL, Manifest: *manifestPath, Out: os.Stdout, Timeout: *timeout,
	})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted; what the demo started is stopped and removed: %w", err)
		}
		return err
	}
	if err := report.Write(os.Stdout); err != nil {
		return err
	}
	if !report.Verdict.Holds() {
		return errors.New("the verdict does not hold")
	}
	return nil
}

// runDev dispatches the local development helpers; `seqinbox dev kafka` is the only one.
func runDev(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "kafka" {
		fmt.Fprintln(os.Stderr, "Usage: seqinbox dev kafka [--port 9092] [--topic name:partitions ...]")
		return errUsage
	}
	fs := flag.NewFlagSet("dev kafka", flag.ContinueOnError)
	port := fs.Int("port", 9092, "port of the broker on 127.0.0.1 (the sample manifest's bootstrap server; 0: any free port)")
	var topics topicFlags
	fs.Var(&topics, "topic", "topic to create, as name:partitions; repeatable (default orders:3 and orders.dlq:1, the sample's)")
	if err := fs.Parse(args[1:]); err != nil {
		return errUsage
	}
	if len(topics) == 0 {
		topics = topicFlags{{Name: "orders", Partitions: 3}, {Name: "orders.dlq", Partitions: 1}}
	}
	cluster, err := demo.StartBroker(*port, topics...)
	if err != nil {
		return err
	}
	defer cluster.Close()
	fmt.Printf("embedded Kafka broker (kfake, in memory) on %s with topics %s; Ctrl-C stops it\n",
		strings.Join(cluster.ListenAddrs(), ","), topics)
	<-ctx.Done()
	return nil
}

// topicFlags collects repeated --topic name:partitions flags.
type topicFlags []demo.Topic

// String implements flag.Value.
func (t topicFlags) String() string {
	parts := make([]string, len(t))
	for i, topic := range t {
		parts[i] = fmt.Sprintf("%s:%d", topic.Name, topic.Partitions)
	}
	return strings.Join(parts, ", ")
}

// Set implements flag.Value.
func (t *topicFlags) Set(v string) error {
	name, count, ok := strings.Cut(v, ":")
	partitions, err := strconv.ParseInt(count, 10, 32)
	if !ok || name == "" || err != nil || partitions < 1 {
		return fmt.Errorf("%q: write name:partitions, for example orders:3", v)
	}
	*t = append(*t, demo.Topic{Name: name, Partitions: int32(partitions)})
	return nil
}
