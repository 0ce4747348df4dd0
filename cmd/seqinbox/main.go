// Command seqinbox is the one binary of the project: the operator, the consumer, the schema
// migrator and the operator's tools, each a subcommand (docs/design.md#command-line).
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		cli.PrintError(os.Stderr, err)
	}
	os.Exit(cli.ExitCode(err))
}

// run executes one command line with its output on stdout and stderr; it returns nil after help.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return cli.Run(ctx, newRootCommand(), args, stdout, stderr)
}

// newRootCommand builds the command tree; every command has a description and an example.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "seqinbox",
		Short: "Operator and consumer runtime for Sequential Inbox Kafka consumers",
		Long: `seqinbox runs Sequential Inbox Kafka consumers: every logical message is claimed once in
PostgreSQL, messages of one context are handed to your HTTP service in the declared order, and
out-of-order messages wait in PostgreSQL until their predecessors were processed.

In Kubernetes, install the operator and apply a SequentialInbox; the operator runs the other
commands (migrate, consume, action) from the same image. Outside Kubernetes, run them yourself.`,
		Example: `  # Apply the schema, then run the consumer of a manifest
  seqinbox migrate --database-url postgres://app@localhost/orders
  seqinbox consume -f inbox.yaml --database-url postgres://app@localhost/orders

  # Print what this build is
  seqinbox version`,
		Version:       version.Version,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetVersionTemplate("{{.Name}} " + versionLine() + "\n")
	root.AddCommand(
		newOperatorCommand(),
		newConsumeCommand(),
		newMigrateCommand(),
		newActionCommand(),
		newInspectCommand(),
		newDeadLettersCommand(),
		newVersionCommand(),
	)
	root.AddCommand(devCommands()...)
	return root
}
