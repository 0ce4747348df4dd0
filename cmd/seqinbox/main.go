// Command seqinbox is the one binary of the project: the operator, the consumer, the schema
// migrator and the local development helpers, each a subcommand (SPEC §10).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand: a one-line summary and a function that parses its own flags.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

// commands is filled by the init functions of the subcommand files of this package.
var commands = map[string]command{}

// errUsage marks an error that already printed its usage; main exits with status 2.
var errUsage = errors.New("usage")

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "seqinbox: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, os.Args[2:]); err != nil {
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "seqinbox %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "Usage: seqinbox <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(os.Stderr, "  %-12s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'seqinbox <command> -h' for the flags of a command.")
}
