package plugin

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

func newApproveCommand(e *env) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "approve NAME",
		Short: "Approve the Supervised rollout an inbox waits for",
		Long: `Approve the rollout that a Supervised inbox waits for (condition RolloutBlocked, reason
AwaitingApproval): the running consumers of another claim protocol stop, and once they are gone the
operator migrates the schema and starts the consumers of the target engine.

The command first shows what will happen, then asks for confirmation on standard input (y or yes)
unless --yes is given. It sets the annotation inbox.seqinbox.dev/approve-rollout to the target
engine version it showed; if the inbox changed meanwhile, it approves nothing and says so.`,
		Example: `  kubectl seqinbox approve order-inbox
  kubectl seqinbox approve order-inbox -n shop --yes`,
		Args:              inboxArg,
		ValidArgsFunction: e.completeInboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.connect()
			if err != nil {
				return err
			}
			ctx, out := cmd.Context(), cmd.OutOrStdout()
			inbox, err := c.inbox(ctx, args[0])
			if err != nil {
				return err
			}
			if err := approvable(inbox); err != nil {
				return err
			}
			st, err := gatherStatus(ctx, c, args[0], e.now())
			if err != nil {
				return err
			}
			writePlan(out, st)
			if !yes && !confirmed(cmd.InOrStdin(), out) {
				return errors.New("not approved: nothing changed; answer y, or pass --yes")
			}
			before := inbox.DeepCopy()
			metav1.SetMetaDataAnnotation(&inbox.ObjectMeta, v1alpha1.ApproveRolloutAnnotation, inbox.Status.TargetEngineVersion)
			err = c.Patch(ctx, inbox, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
			if apierrors.IsConflict(err) {
				return fmt.Errorf("SequentialInbox %s changed while you looked at it; nothing was approved: run the command again to see the new plan", inbox.Name)
			}
			if err != nil {
				return fmt.Errorf("set %s on SequentialInbox %s: %w", v1alpha1.ApproveRolloutAnnotation, inbox.Name, err)
			}
			_, _ = fmt.Fprintf(out, "Approved: %s=%s set on sequentialinbox/%s. `kubectl seqinbox status %s -n %s` follows the rollout.\n",
				v1alpha1.ApproveRolloutAnnotation, inbox.Status.TargetEngineVersion, inbox.Name, inbox.Name, inbox.Namespace)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "approve without asking for confirmation")
	return cmd
}

// approvable says why the inbox has no rollout to approve, or nil when it waits for approval.
func approvable(inbox *v1alpha1.SequentialInbox) error {
	target := inbox.Status.TargetEngineVersion
	if inbox.Spec.UpgradeStrategy != v1alpha1.UpgradeSupervised {
		return fmt.Errorf("SequentialInbox %s has upgradeStrategy %s: its rollouts need no approval", inbox.Name, inbox.Spec.UpgradeStrategy)
	}
	if a := inbox.Annotations[v1alpha1.ApproveRolloutAnnotation]; a != "" && a == target {
		return fmt.Errorf("SequentialInbox %s is approved for %s already; `kubectl seqinbox status %s` shows how the rollout goes", inbox.Name, a, inbox.Name)
	}
	c := meta.FindStatusCondition(inbox.Status.Conditions, v1alpha1.ConditionRolloutBlocked)
	if c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.AwaitingApprovalReason && target != "" {
		return nil
	}
	state := "no RolloutBlocked condition yet"
	if c != nil {
		state = fmt.Sprintf("RolloutBlocked is %s (%s)", c.Status, c.Reason)
	}
	return fmt.Errorf("SequentialInbox %s waits for no approval (%s): nothing to approve", inbox.Name, state)
}

// writePlan says what the approval will set in motion.
func writePlan(w io.Writer, st *Status) {
	r := st.Rollout
	_, _ = fmt.Fprintf(w, "Approve the rollout of sequentialinbox/%s (namespace %s) to engine %s (claim protocol %s, image %s).\n",
		st.Name, st.Namespace, r.Target.Version, dash(r.Target.ClaimProtocol), dash(r.Target.Image))
	var pods []string
	for _, c := range st.Consumers {
		if c.Phase != "Gone" {
			pods = append(pods, c.Name)
		}
	}
	running := fmt.Sprintf("engine %s, claim protocol %s", dash(r.Running.Version), dash(r.Running.ClaimProtocol))
	_, _ = fmt.Fprintln(w, "What happens then:")
	if len(pods) > 0 {
		_, _ = fmt.Fprintf(w, "  1. The %d running consumer pod(s) (%s) stop: %s. Processing pauses; Kafka keeps the records (lag now %d).\n",
			len(pods), running, strings.Join(pods, ", "), st.Lag)
	} else {
		_, _ = fmt.Fprintf(w, "  1. The consumers of %s stop (no consumer pod runs now).\n", running)
	}
	_, _ = fmt.Fprintf(w, "  2. The operator waits until their pods are gone, the Kafka consumer group is empty and the database registry shows no live consumer of %s.\n", dash(r.Running.Version))
	_, _ = fmt.Fprintf(w, "  3. It migrates the schema with a Job from the target image, then starts %d consumer(s) of %s.\n", st.Replicas.Spec, r.Target.Version)
}

// confirmed asks on out and reads the answer from in: y or yes approves, anything else (or no
// answer) does not.
func confirmed(in io.Reader, out io.Writer) bool {
	_, _ = fmt.Fprint(out, "Approve? [y/N] ")
	answer, _ := bufio.NewReader(in).ReadString('\n')
	answer = strings.ToLower(strings.TrimSpace(answer))
	return answer == "y" || answer == "yes"
}
