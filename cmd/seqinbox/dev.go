//go:build dev

package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/demo"
)

// devCommands are the local development helpers: `demo` (what `make demo` runs) and `dev kafka`,
// built only with `-tags dev` so that the release binary links no embedded broker.
func devCommands() []*cobra.Command {
	return []*cobra.Command{newDemoCommand(), newDevCommand()}
}

func newDemoCommand() *cobra.Command {
	var (
		databaseURL, manifestPath string
		timeout                   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the claim engine locally on embedded defaults and print a report (make demo)",
		Long: `Run the whole claim engine on one machine: an embedded Kafka broker, a temporary database on
the given PostgreSQL server, a demo sink and two consumers of the sample SequentialInbox. It
sends out-of-order, duplicated, filtered, rejected and poisoned order events, prints a report with
a verdict, and removes everything it started, also on Ctrl-C.`,
		Example: `  # What make demo runs
  seqinbox demo --database-url postgres://postgres@127.0.0.1:5432/postgres`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fromEnv(cmd, "database-url", envDatabaseURL, &databaseURL)
			if databaseURL == "" {
				return cli.UsageErrorf("--database-url or %s is required (make demo finds a server with hack/postgres.sh)", envDatabaseURL)
			}
			binary, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the seqinbox binary for the consumers: %w", err)
			}
			ctx, out := cmd.Context(), cmd.OutOrStdout()
			report, err := demo.Run(ctx, demo.Options{
				Binary: binary, DatabaseURL: databaseURL, Manifest: manifestPath, Out: out, Timeout: timeout,
			})
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("interrupted; what the demo started is stopped and removed: %w", err)
				}
				return err
			}
			if err := report.Write(out); err != nil {
				return err
			}
			if !report.Verdict.Holds() {
				return errors.New("the verdict does not hold")
			}
			return nil
		},
	}
	addDatabaseURLFlag(cmd, &databaseURL, "PostgreSQL server (any database of it) on which the demo creates and drops its temporary database")
	addManifestFlag(cmd, &manifestPath, "config/samples/inbox_v1alpha1_sequentialinbox.yaml", "SequentialInbox manifest the consumers run")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "how long the consumers may take to process the scenario")
	return cmd
}

func newDevCommand() *cobra.Command {
	cmd := cli.GroupCommand(&cobra.Command{
		Use:     "dev",
		Short:   "Local development helpers",
		Long:    `Local development helpers; 'dev kafka' runs an embedded Kafka broker for 'seqinbox consume'.`,
		Example: `  seqinbox dev kafka`,
	})
	var topics topicFlags
	var port int
	kafka := &cobra.Command{
		Use:   "kafka",
		Short: "Run an embedded Kafka broker (kfake, in memory) until Ctrl-C",
		Long: `Run an embedded Kafka broker on 127.0.0.1: kfake, a broker written in Go that speaks the Kafka
protocol and keeps everything in memory. By default it listens on port 9092 with the topics of
the sample manifest, so 'seqinbox consume -f config/samples/inbox_v1alpha1_sequentialinbox.yaml'
finds it.`,
		Example: `  seqinbox dev kafka
  seqinbox dev kafka --port 0 --topic payments:6 --topic payments.dlq:1`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(topics) == 0 {
				topics = topicFlags{{Name: "orders", Partitions: 3}, {Name: "orders.dlq", Partitions: 1}}
			}
			cluster, err := demo.StartBroker(port, topics...)
			if err != nil {
				return err
			}
			defer cluster.Close()
			_, _ = fmt.Fprintf(cmd.OutOrStdout(), "embedded Kafka broker (kfake, in memory) on %s with topics %s; Ctrl-C stops it\n",
				strings.Join(cluster.ListenAddrs(), ","), topics.String())
			<-cmd.Context().Done()
			return nil
		},
	}
	kafka.Flags().IntVar(&port, "port", 9092, "port of the broker on 127.0.0.1 (the sample manifest's bootstrap server; 0: any free port)")
	kafka.Flags().Var(&topics, "topic", "topic to create, as name:partitions; repeatable (default orders:3 and orders.dlq:1, the sample's)")
	cmd.AddCommand(kafka)
	return cmd
}

// topicFlags collects repeated --topic name:partitions flags.
type topicFlags []demo.Topic

var _ pflag.Value = (*topicFlags)(nil)

// String implements pflag.Value.
func (t *topicFlags) String() string {
	parts := make([]string, len(*t))
	for i, topic := range *t {
		parts[i] = fmt.Sprintf("%s:%d", topic.Name, topic.Partitions)
	}
	return strings.Join(parts, ", ")
}

// Set implements pflag.Value.
func (t *topicFlags) Set(v string) error {
	name, count, ok := strings.Cut(v, ":")
	partitions, err := strconv.ParseInt(count, 10, 32)
	if !ok || name == "" || err != nil || partitions < 1 {
		return fmt.Errorf("%q: write name:partitions, for example orders:3", v)
	}
	*t = append(*t, demo.Topic{Name: name, Partitions: int32(partitions)})
	return nil
}

// Type implements pflag.Value.
func (t *topicFlags) Type() string { return "name:partitions" }
