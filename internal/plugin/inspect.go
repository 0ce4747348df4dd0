package plugin

import (
	"cmp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/seqinbox/seqinbox/internal/cli"
)

// inspectSince is the first release whose `seqinbox` has the inspect command that this command
// runs in a consumer pod.
const inspectSince = "v0.1.0"

// inspectRequest is what inspect asks the consumer pod's `seqinbox inspect` for.
type inspectRequest struct {
	contextID, sequence, message, output string
}

func newInspectCommand(e *env) *cobra.Command {
	var req inspectRequest
	cmd := &cobra.Command{
		Use:   "inspect NAME (--context-id ID [--sequence S] | --message TYPE/ID)",
		Short: "Show one sequence instance as the engine sees it, and what its waiting messages wait for",
		Long: `Show one sequence instance as the engine sees it: whether it is open or closed, until when it is
retained or kept for duplicates, every message with its type, idempotence ID, state and times, and
for each WAITING message its release condition and which predecessors are still missing, in
words. --message TYPE/ID shows one message (qualified type and idempotence ID) and its instance.

The database is read in the cluster: the command runs 'seqinbox inspect' in the newest ready
consumer pod of the inbox (pods/exec), with the pod's own manifest and credentials, so you need no
database access and no Secret leaves the cluster. It only reads. -o json or -o yaml prints the
same data for scripts; the exit code is the pod command's.`,
		Example: `  # What does order 42 wait for?
  kubectl seqinbox inspect order-inbox --context-id 42

  # One message and its instance, as YAML
  kubectl seqinbox inspect order-inbox --message OrderShipped/order-42-shipped -o yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if err := inboxArg(cmd, args); err != nil {
				return err
			}
			return req.validate()
		},
		ValidArgsFunction: e.completeInboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(req.output); err != nil {
				return err
			}
			c, err := e.connect()
			if err != nil {
				return err
			}
			inbox, err := c.inbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			code, err := execInConsumer(cmd.Context(), c, inbox, req.podCommand(), cmd.OutOrStdout(), e.streams.ErrOut)
			if err != nil {
				return err
			}
			return cli.Exited(code)
		},
	}
	cmd.Flags().StringVar(&req.contextID, "context-id", "", "context ID of the instance")
	cmd.Flags().StringVar(&req.sequence, "sequence", "", "sequence of the instance; needed when instances of several sequences have the context ID")
	cmd.Flags().StringVar(&req.message, "message", "", "one message, as TYPE/ID: its qualified type and idempotence ID")
	addOutputFlag(cmd, &req.output)
	return cmd
}

// validate refuses a request that names neither an instance nor a message, or a malformed message.
func (r inspectRequest) validate() error {
	if r.message != "" {
		if typ, id, ok := strings.Cut(r.message, "/"); !ok || typ == "" || id == "" {
			return cli.UsageErrorf("--message %q: name the message as TYPE/ID, for example OrderPaid/order-42-paid", r.message)
		}
	}
	if r.contextID == "" && r.message == "" {
		return cli.UsageErrorf("--context-id or --message is required: the instance of a context ID, or one message")
	}
	return nil
}

// podCommand is the `seqinbox inspect` command line of the request, on the pod's own manifest:
// the pod renders the text screen too, so that it and -o json|yaml come from one place.
func (r inspectRequest) podCommand() podCommand {
	args := []string{"inspect", "-f", podManifest, "-o", cmp.Or(r.output, "text")}
	for _, f := range [][2]string{{"--context-id", r.contextID}, {"--sequence", r.sequence}, {"--message", r.message}} {
		if f[1] != "" {
			args = append(args, f[0], f[1])
		}
	}
	return podCommand{Args: args, Since: inspectSince}
}
