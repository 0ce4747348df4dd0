// Command seqinbox is the one binary of the project: the operator, the consumer, the schema
// migrator and the operator's tools, each a subcommand (docs/design.md#command-line).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"

	"github.com/seqinbox/seqinbox/internal/version"
)

// Exit codes of every command.
const (
	exitOK     = 0 // done, or help was asked for
	exitFailed = 1 // the command ran and failed
	exitUsage  = 2 // the command line is wrong: unknown command or flag, bad argument or flag value
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		printError(os.Stderr, err)
	}
	os.Exit(exitCode(err))
}

// commandError is the error of one command line: which command failed, and whether the command
// line itself was wrong (exit 2) or the command ran and failed (exit 1).
type commandError struct {
	path  string
	usage bool
	err   error
}

func (e *commandError) Error() string { return e.path + ": " + e.err.Error() }
func (e *commandError) Unwrap() error { return e.err }

// usageError marks an error in a flag value that a command found itself (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usageErrorf returns a usage error: the command line asks for something the command cannot do.
func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// run executes one command line with its output on stdout and stderr; it returns nil after help.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// started is set once cobra has accepted the command line: an error before is a usage error.
	started := false
	root := newRootCommand()
	markStarted(root, &started)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return nil
	}
	return &commandError{path: cmd.CommandPath(), usage: !started || errors.As(err, new(usageError)), err: err}
}

// exitCode maps the error of run to the process exit status.
func exitCode(err error) int {
	var ce *commandError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ce) && ce.usage:
		return exitUsage
	default:
		return exitFailed
	}
}

// printError writes the error for a person: the failing command, then one error per line (an
// aggregate of validation errors is split, one field per line; a repeated line is written once),
// and for a usage error where to find the usage.
func printError(w io.Writer, err error) {
	var ce *commandError
	if !errors.As(err, &ce) {
		ce = &commandError{path: "seqinbox", err: err}
	}
	msg := ce.err.Error()
	var agg utilerrors.Aggregate
	if errors.As(ce.err, &agg) && len(agg.Errors()) > 1 && strings.HasSuffix(msg, agg.Error()) {
		lines := []string{strings.TrimSuffix(strings.TrimSpace(strings.TrimSuffix(msg, agg.Error())), ":") + ":"}
		for _, e := range agg.Errors() {
			lines = append(lines, e.Error())
		}
		msg = strings.Join(lines, "\n")
	}
	// A line the same as the one before says nothing new: pgx reports the same refused
	// connection once per attempt (with and without TLS).
	lines := slices.Compact(strings.Split(strings.TrimRight(msg, "\n"), "\n"))
	_, _ = fmt.Fprintf(w, "%s: %s\n", ce.path, lines[0])
	for _, l := range lines[1:] {
		_, _ = fmt.Fprintf(w, "  %s\n", strings.TrimSpace(l))
	}
	if ce.usage {
		_, _ = fmt.Fprintf(w, "Run '%s --help' for usage.\n", ce.path)
	}
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
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newOperatorCommand(),
		newConsumeCommand(),
		newMigrateCommand(),
		newActionCommand(),
		newDeadLettersCommand(),
		newVersionCommand(),
	)
	root.AddCommand(devCommands()...)
	return root
}

// markStarted wraps the RunE of every command of the tree so that it sets *started: cobra has
// accepted the command line (arguments, flags, required flags) when it calls RunE.
func markStarted(cmd *cobra.Command, started *bool) {
	if runE := cmd.RunE; runE != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			*started = true
			return runE(c, args)
		}
	}
	for _, sub := range cmd.Commands() {
		markStarted(sub, started)
	}
}

// groupCommand makes cmd a command that only holds subcommands: alone it prints its help; with
// an argument that names no subcommand it is a usage error.
func groupCommand(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageErrorf("unknown command %q for %q", args[0], c.CommandPath())
		}
		return c.Help()
	}
	return cmd
}

// noArgs accepts a command line without positional arguments; anything else is a usage error.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("takes no arguments, got %q", strings.Join(args, " "))
	}
	return nil
}
