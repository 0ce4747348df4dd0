// Package cli is the command-line convention that the project's binaries share (`seqinbox` and
// the kubectl plugin `kubectl-seqinbox`): exit codes, usage errors, and errors printed for a person
// as `COMMAND: what went wrong: what to do`.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
)

// Exit codes of every command.
const (
	// ExitOK: done, or help was asked for.
	ExitOK = 0
	// ExitFailed: the command ran and failed.
	ExitFailed = 1
	// ExitUsage: the command line is wrong: unknown command or flag, bad argument or flag value.
	ExitUsage = 2
)

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

// exitError ends a command whose work ran elsewhere (a command in a pod) and whose output
// already said what happened: the process exits with code and prints nothing more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Exited returns the outcome of a command that ran elsewhere and exited with code: nil for
// ExitOK, else an error that makes the process exit with code without printing a second message.
func Exited(code int) error {
	if code == ExitOK {
		return nil
	}
	return exitError{code}
}

// UsageError marks err as a usage error: the command line asks for something the command cannot do.
func UsageError(err error) error { return usageError{err} }

// UsageErrorf returns a usage error: the command line asks for something the command cannot do.
func UsageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// Run executes one command line of the tree root with its output on stdout and stderr; it returns
// nil after help. An error names the failing command and says whether the command line was wrong.
func Run(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) error {
	// started is set once cobra has accepted the command line: an error before is a usage error.
	started := false
	markStarted(root, &started)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return nil
	}
	return &commandError{path: cmd.CommandPath(), usage: !started || errors.As(err, new(usageError)), err: err}
}

// ExitCode maps the error of Run to the process exit status.
func ExitCode(err error) int {
	var ce *commandError
	var exited exitError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &exited):
		return exited.code
	case errors.As(err, &ce) && ce.usage:
		return ExitUsage
	default:
		return ExitFailed
	}
}

// PrintError writes the error of Run for a person: the failing command, then one error per line
// (an aggregate of validation errors is split, one field per line; a repeated line is written
// once), and for a usage error where to find the usage.
func PrintError(w io.Writer, err error) {
	if errors.As(err, new(exitError)) {
		return
	}
	var ce *commandError
	if !errors.As(err, &ce) {
		ce = &commandError{path: "error", err: err}
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

// GroupCommand makes cmd a command that only holds subcommands: alone it prints its help; with
// an argument that names no subcommand it is a usage error.
func GroupCommand(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return UsageErrorf("unknown command %q for %q", args[0], c.CommandPath())
		}
		return c.Help()
	}
	return cmd
}

// NoArgs accepts a command line without positional arguments; anything else is a usage error.
func NoArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return UsageErrorf("takes no arguments, got %q", strings.Join(args, " "))
	}
	return nil
}
