package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/cli"
)

// actionPollInterval is how often a waiting action command reads the action's status.
var actionPollInterval = 500 * time.Millisecond

// actionCommand describes the command of one action type.
type actionCommand struct {
	use, target, short, long, example string
	// onMessage is true for the actions on a message (TYPE/ID), false for those on an instance
	// (SEQUENCE/CONTEXT).
	onMessage bool
}

// actionCommands are the commands of the actions, by action type.
var actionCommands = map[v1alpha1.ActionType]actionCommand{
	v1alpha1.ActionConsume: {use: "consume", target: "TYPE/ID", onMessage: true,
		short: "Deliver one message to the sink now, whatever its state",
		long: `Deliver one message to the sink now, whatever its state, then release what waited for it. The
message is named by its qualified type and its idempotence ID. If the delivery fails, the message
is FAILED without a claim and dead-lettered, so a resend retries it.`,
		example: `  kubectl seqinbox consume order-inbox OrderPaid/order-42-paid
  kubectl seqinbox consume order-inbox OrderValidated.STOCK_AVAILABLE/order-42-validated --no-wait`},
	v1alpha1.ActionExpire: {use: "expire", target: "TYPE/ID", onMessage: true,
		short: "Mark one message processed without delivering it",
		long: `Mark one waiting or failed message processed without delivering it; what waited for it becomes
releasable. On a processed message it does nothing.`,
		example: `  kubectl seqinbox expire order-inbox OrderPaid/order-42-paid`},
	v1alpha1.ActionConsumeAll: {use: "consume-all", target: "SEQUENCE/CONTEXT",
		short: "Deliver every buffered message of one sequence instance, conditions ignored",
		long: `Deliver every buffered message of one sequence instance now, release conditions ignored. The
instance is named by its sequence and its context ID.`,
		example: `  kubectl seqinbox consume-all order-inbox order/42`},
	v1alpha1.ActionClose: {use: "close", target: "SEQUENCE/CONTEXT",
		short: "Close one sequence instance without delivering its buffered messages",
		long: `Close one sequence instance without delivering its buffered messages: they are set FAILED and
dead-lettered with reason OperatorAction, so a retry can still deliver them.`,
		example: `  kubectl seqinbox close order-inbox order/42`},
}

// newActionCommand builds the command that requests one action type as a SequentialInboxAction
// and, unless --no-wait, waits until a consumer executed it or it failed.
func newActionCommand(e *env, typ v1alpha1.ActionType) *cobra.Command {
	ac := actionCommands[typ]
	var (
		output  string
		noWait  bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   ac.use + " NAME " + ac.target,
		Short: ac.short,
		Long: ac.long + `

The command creates a SequentialInboxAction (the operator records it in the inbox's database with a
Job from the inbox's image, and a consumer executes it), waits until it is Executed or Failed and
prints the outcome. It exits 0 when the action was executed, 1 when it failed or did not finish
within --timeout (the action stays requested). --no-wait returns once the action is created.`,
		Example: ac.example,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return cli.UsageErrorf("takes the name of a SequentialInbox and %s, got %d arguments", ac.target, len(args))
			}
			_, err := actionSpec(typ, args[0], args[1])
			return err
		},
		ValidArgsFunction: e.completeInboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			spec, _ := actionSpec(typ, args[0], args[1])
			c, err := e.connect()
			if err != nil {
				return err
			}
			if _, err := c.inbox(cmd.Context(), args[0]); err != nil {
				return err
			}
			action := &v1alpha1.SequentialInboxAction{
				ObjectMeta: metav1.ObjectMeta{GenerateName: args[0] + "-" + ac.use + "-", Namespace: c.namespace},
				Spec:       spec,
			}
			if err := c.Create(cmd.Context(), action); err != nil {
				return fmt.Errorf("create the SequentialInboxAction: %w", err)
			}
			out := cmd.OutOrStdout()
			if output == outputText {
				_, _ = fmt.Fprintf(out, "sequentialinboxaction/%s created: %s on %s\n", action.Name, typ, describeTarget(spec))
			}
			if !noWait {
				if err := awaitAction(cmd.Context(), c, action, timeout); err != nil {
					return err
				}
			}
			if output != outputText {
				action.ManagedFields = nil
				action.APIVersion, action.Kind = v1alpha1.GroupVersion.String(), "SequentialInboxAction"
				return printData(out, output, action)
			}
			if !noWait {
				_, _ = fmt.Fprintf(out, "%s: %s\n", action.Status.Phase, action.Status.Message)
			}
			return actionOutcome(action)
		},
	}
	addOutputFlag(cmd, &output)
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the SequentialInboxAction is created, without waiting for its outcome")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the outcome; the action stays requested after it")
	return cmd
}

// actionSpec builds the spec of an action of typ on inbox from its target argument; a target
// without its two parts is a usage error.
func actionSpec(typ v1alpha1.ActionType, inbox, target string) (v1alpha1.SequentialInboxActionSpec, error) {
	ac := actionCommands[typ]
	first, second, ok := strings.Cut(target, "/")
	if !ok || first == "" || second == "" {
		return v1alpha1.SequentialInboxActionSpec{}, cli.UsageErrorf("%q: name the %s as %s, for example %s",
			target, map[bool]string{true: "message", false: "instance"}[ac.onMessage], ac.target,
			map[bool]string{true: "OrderPaid/order-42-paid", false: "order/42"}[ac.onMessage])
	}
	spec := v1alpha1.SequentialInboxActionSpec{InboxName: inbox, Action: typ}
	if ac.onMessage {
		spec.Message = &v1alpha1.ActionMessageTarget{Type: first, IdempotenceID: second}
	} else {
		spec.Instance = &v1alpha1.ActionInstanceTarget{Sequence: first, ContextID: second}
	}
	return spec, nil
}

// describeTarget names the action's target as the operator's messages do.
func describeTarget(spec v1alpha1.SequentialInboxActionSpec) string {
	if m := spec.Message; m != nil {
		return "message " + m.Type + "/" + m.IdempotenceID
	}
	return "instance " + spec.Instance.Sequence + "/" + spec.Instance.ContextID
}

// awaitAction reads the action until its phase is final or timeout passed; action holds the last read.
func awaitAction(ctx context.Context, c *clients, action *v1alpha1.SequentialInboxAction, timeout time.Duration) error {
	// Each read runs under the command's context, not the poll's: a read that the poll's deadline
	// would cut (client-go's rate limiter refuses early) is the timeout, not a failed read.
	err := wait.PollUntilContextTimeout(ctx, actionPollInterval, timeout, true, func(context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(action), action); err != nil {
			return false, fmt.Errorf("read sequentialinboxaction/%s: %w", action.Name, err)
		}
		return action.Status.Phase == v1alpha1.ActionExecuted || action.Status.Phase == v1alpha1.ActionFailed, nil
	})
	if wait.Interrupted(err) {
		phase := string(action.Status.Phase)
		if phase == "" {
			phase = "not picked up by the operator (is it running?)"
		}
		return fmt.Errorf("sequentialinboxaction/%s is still %s after %s: %s; it stays requested, `kubectl get sqia %s -n %s` shows when it is done",
			action.Name, phase, timeout, cmp.Or(action.Status.Message, "no message yet"), action.Name, action.Namespace)
	}
	return err
}

// actionOutcome is nil for an executed (or not awaited) action and the reason of a failed one.
func actionOutcome(action *v1alpha1.SequentialInboxAction) error {
	if action.Status.Phase != v1alpha1.ActionFailed {
		return nil
	}
	reason := ""
	for _, typ := range []string{v1alpha1.ConditionExecuted, v1alpha1.ConditionRecorded} {
		if c := meta.FindStatusCondition(action.Status.Conditions, typ); c != nil && c.Status == metav1.ConditionFalse {
			reason = c.Reason
			break
		}
	}
	return errors.New("sequentialinboxaction/" + action.Name + " failed (" + reason + "): " + action.Status.Message)
}
