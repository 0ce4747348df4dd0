// Command kubectl-seqinbox is the kubectl plugin of seqinbox (`kubectl seqinbox`): the status of
// an inbox on one screen, operator actions, rollout approval and a support report. The commands
// live in internal/plugin; this wires them to the process.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/plugin"
)

func main() {
	// The plugin reports errors, it does not log: controller-runtime's client would warn that no logger is set.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	err := cli.Run(ctx, plugin.NewRootCommand(streams), plugin.Args(os.Args[0], os.Args[1:]), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		cli.PrintError(os.Stderr, err)
	}
	os.Exit(cli.ExitCode(err))
}
