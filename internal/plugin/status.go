package plugin

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// recentEvents is how many of the inbox's latest events the status shows.
const recentEvents = 5

// shownPerList is how many waiting types and dead-letter reasons the screen shows, each under its
// total, so that it stays one screen; -o yaml has them all.
const shownPerList = 5

// expectedConditions is the status each condition of a healthy inbox has, in the order the
// status shows the ones that differ.
var expectedConditions = []struct {
	typ    string
	status metav1.ConditionStatus
}{
	{v1alpha1.ConditionReady, metav1.ConditionTrue},
	{v1alpha1.ConditionConfigValid, metav1.ConditionTrue},
	{v1alpha1.ConditionSchemaReady, metav1.ConditionTrue},
	{v1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse},
	{v1alpha1.ConditionProgressing, metav1.ConditionFalse},
	{v1alpha1.ConditionDegraded, metav1.ConditionFalse},
	{v1alpha1.ConditionScalingLimited, metav1.ConditionFalse},
}

// Status is everything `kubectl seqinbox status` shows, gathered from the API server: the inbox's
// status (what the operator decided and what the consumers report), its consumer pods and events.
type Status struct {
	// Namespace and Name name the inbox.
	Namespace string `json:"namespace"`
	// Name is the inbox's name.
	Name string `json:"name"`
	// Generation is the spec's generation, ObservedGeneration the last one the operator reconciled.
	Generation int64 `json:"generation"`
	// ObservedGeneration is the generation of the last fully reconciled spec.
	ObservedGeneration int64 `json:"observedGeneration"`
	// Ready is the Ready condition; nil until the operator reported one.
	Ready *ConditionView `json:"ready,omitempty"`
	// Attention lists the conditions whose status is not the healthy one, Ready first.
	Attention []ConditionView `json:"attention"`
	// Rollout is what runs, what the spec asks for, and what the rollout waits for.
	Rollout Rollout `json:"rollout"`
	// Replicas counts the consumers asked for, run and ready.
	Replicas Replicas `json:"replicas"`
	// Consumers are the consumer pods, from the API server and from what they reported.
	Consumers []Consumer `json:"consumers"`
	// Lag is the records not processed yet, over every partition, as the consumers reported it.
	Lag int64 `json:"lag"`
	// Waiting is the buffer: messages waiting for their predecessors and instances expiring soon.
	Waiting Waiting `json:"waiting"`
	// DeadLettersLastHour is the records the running consumers dead-lettered in the last hour.
	DeadLettersLastHour int64 `json:"deadLettersLastHour"`
	// DeadLettersByReason is DeadLettersLastHour by reason, most first.
	DeadLettersByReason []v1alpha1.DeadLetterReasonCount `json:"deadLettersByReason"`
	// ReportedAt is when the operator last wrote what the consumers reported; nil before it did.
	ReportedAt *metav1.Time `json:"reportedAt,omitempty"`
	// Events are the inbox's latest events, oldest first.
	Events []Event `json:"events"`
	// Now is when the status was gathered; the ages of the text screen are relative to it.
	Now metav1.Time `json:"now"`
}

// ConditionView is one condition of the inbox.
type ConditionView struct {
	// Type is the condition type (Ready, Degraded, ...).
	Type string `json:"type"`
	// Status is True, False or Unknown.
	Status metav1.ConditionStatus `json:"status"`
	// Expected is the status of a healthy inbox.
	Expected metav1.ConditionStatus `json:"expected"`
	// Reason is the CamelCase reason (docs/troubleshooting.md lists them).
	Reason string `json:"reason,omitempty"`
	// Message says what happened, for a person.
	Message string `json:"message,omitempty"`
	// Since is the condition's last transition.
	Since metav1.Time `json:"since"`
}

// Rollout says what runs, what the spec asks for and what stands between them.
type Rollout struct {
	// Strategy is spec.upgradeStrategy: Automatic or Supervised.
	Strategy v1alpha1.UpgradeStrategy `json:"strategy"`
	// Running is the engine the consumers that may run speak.
	Running Engine `json:"running"`
	// Target is the engine of the image the spec asks for.
	Target Engine `json:"target"`
	// SchemaVersion is the database schema version of the last migration.
	SchemaVersion int32 `json:"schemaVersion"`
	// WaitingFor is the reason of what the rollout waits for (the RolloutBlocked condition, else
	// Progressing); empty when it waits for nothing.
	WaitingFor string `json:"waitingFor,omitempty"`
	// WaitingMessage is that condition's message.
	WaitingMessage string `json:"waitingMessage,omitempty"`
	// AwaitingApproval is true while a Supervised rollout waits for `kubectl seqinbox approve`.
	AwaitingApproval bool `json:"awaitingApproval"`
	// Approved is the engine version the approval annotation names, if any.
	Approved string `json:"approved,omitempty"`
}

// Engine is an engine version and the claim protocol it speaks.
type Engine struct {
	// Version is the engine version (the release of the image).
	Version string `json:"version,omitempty"`
	// ClaimProtocol is the claim protocol of that version.
	ClaimProtocol string `json:"claimProtocol,omitempty"`
	// Image is the image the version was learned from (target only).
	Image string `json:"image,omitempty"`
}

// Replicas counts consumers: asked for by the spec, run by the Deployment, ready.
type Replicas struct {
	// Spec is spec.replicas.
	Spec int32 `json:"spec"`
	// Running is the replicas the Deployment asks for (fewer when ScalingLimited).
	Running int32 `json:"running"`
	// Ready is the ready consumer pods.
	Ready int32 `json:"ready"`
}

// Consumer is one consumer pod: what the API server says about the pod and what the consumer
// last reported to the operator.
type Consumer struct {
	// Name is the pod's name, the consumer's instance ID.
	Name string `json:"name"`
	// Phase is the pod's phase; "Gone" for a consumer that reported but whose pod no longer exists.
	Phase string `json:"phase"`
	// Restarts counts the restarts of the pod's containers.
	Restarts int32 `json:"restarts"`
	// Reported is true when the operator has a report of the consumer.
	Reported bool `json:"reported"`
	// Ready is the consumer's own readiness, Reason why it is not ready.
	Ready bool `json:"ready"`
	// Reason says why the consumer is not ready.
	Reason string `json:"reason,omitempty"`
	// Partitions are the partitions it holds: `orders[0,3]`.
	Partitions string `json:"partitions,omitempty"`
	// Lag is the records not processed yet on its partitions.
	Lag int64 `json:"lag"`
	// Blocked is the record it has retried longest after infrastructure errors.
	Blocked *v1alpha1.BlockedRecord `json:"blocked,omitempty"`
	// Unreachable says why the operator could not read the consumer at its last try.
	Unreachable string `json:"unreachable,omitempty"`
}

// Waiting is the buffer, counted database-wide by the consumer that leads housekeeping.
type Waiting struct {
	// Messages is the WAITING messages; nil while no consumer leads housekeeping.
	Messages *int64 `json:"messages,omitempty"`
	// OldestSince is about when the oldest of them arrived.
	OldestSince *metav1.Time `json:"oldestSince,omitempty"`
	// InstancesExpiringSoon is the open instances whose retention ends within the housekeeping window.
	InstancesExpiringSoon *int64 `json:"instancesExpiringSoon,omitempty"`
	// ByType is Messages by qualified type with the oldest of each, most first (at most
	// v1alpha1.MaxWaitingTypes types).
	ByType []v1alpha1.WaitingTypeStatus `json:"byType"`
}

// Event is one event of the inbox.
type Event struct {
	// Time is when it last happened.
	Time metav1.Time `json:"time"`
	// Type is Normal or Warning.
	Type string `json:"type"`
	// Reason is the event's reason.
	Reason string `json:"reason"`
	// Message says what happened.
	Message string `json:"message"`
	// Count is how often it happened.
	Count int32 `json:"count"`
}

func newStatusCommand(e *env) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show an inbox on one screen",
		Long: `Show a SequentialInbox on one screen: the conditions that are not as they should be, with their
messages; the rollout (running and target engine and claim protocol, what it waits for); the
consumer pods with their partitions, lag and blocked record; the messages waiting for their
predecessors and the age of the oldest; the dead letters of the last hour; the latest events.

The numbers are what the consumers last reported to the operator (status.consumers), written at
most every 30 seconds. -o json or -o yaml prints the same data for scripts.`,
		Example: `  kubectl seqinbox status order-inbox
  kubectl seqinbox status order-inbox -n shop -o json`,
		Args:              inboxArg,
		ValidArgsFunction: e.completeInboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := e.connect()
			if err != nil {
				return err
			}
			st, err := gatherStatus(cmd.Context(), c, args[0], e.now())
			if err != nil {
				return err
			}
			if output != outputText {
				return printData(cmd.OutOrStdout(), output, st)
			}
			renderStatus(cmd.OutOrStdout(), screenOf(cmd.OutOrStdout()), st)
			return nil
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// gatherStatus collects the status of the inbox name at now.
func gatherStatus(ctx context.Context, c *clients, name string, now time.Time) (*Status, error) {
	inbox, err := c.inbox(ctx, name)
	if err != nil {
		return nil, err
	}
	st := statusOf(inbox, now)
	pods, err := consumerPods(ctx, c, inbox)
	if err != nil {
		return nil, err
	}
	st.Consumers = consumersOf(inbox, pods)
	if st.Events, err = inboxEvents(ctx, c, inbox); err != nil {
		return nil, err
	}
	return st, nil
}

// statusOf is what the inbox's own status says.
func statusOf(inbox *v1alpha1.SequentialInbox, now time.Time) *Status {
	s := inbox.Status
	st := &Status{Namespace: inbox.Namespace, Name: inbox.Name, Generation: inbox.Generation, ObservedGeneration: s.ObservedGeneration,
		Attention: []ConditionView{}, Consumers: []Consumer{}, Events: []Event{}, Now: metav1.NewTime(now),
		Waiting: Waiting{ByType: []v1alpha1.WaitingTypeStatus{}}, DeadLettersByReason: []v1alpha1.DeadLetterReasonCount{},
		Replicas: Replicas{Spec: ptr.Deref(inbox.Spec.Replicas, 1), Running: s.Replicas, Ready: s.ReplicasReady},
		Rollout: Rollout{
			Strategy:      inbox.Spec.UpgradeStrategy,
			Running:       Engine{Version: s.RunningEngineVersion, ClaimProtocol: s.RunningClaimProtocol},
			Target:        Engine{Version: s.TargetEngineVersion, ClaimProtocol: s.TargetClaimProtocol, Image: s.TargetImage},
			SchemaVersion: s.SchemaVersion,
			Approved:      inbox.Annotations[v1alpha1.ApproveRolloutAnnotation],
		}}
	for _, want := range expectedConditions {
		c := meta.FindStatusCondition(s.Conditions, want.typ)
		if c == nil {
			continue
		}
		view := ConditionView{Type: c.Type, Status: c.Status, Expected: want.status, Reason: c.Reason, Message: c.Message, Since: c.LastTransitionTime}
		if c.Type == v1alpha1.ConditionReady {
			st.Ready = &view
		}
		if c.Status != want.status {
			st.Attention = append(st.Attention, view)
		}
	}
	if c := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionRolloutBlocked); c != nil && c.Status == metav1.ConditionTrue {
		st.Rollout.WaitingFor, st.Rollout.WaitingMessage = c.Reason, c.Message
		st.Rollout.AwaitingApproval = c.Reason == v1alpha1.AwaitingApprovalReason
		// Progressing then says the same; shown once.
		st.Attention = slices.DeleteFunc(st.Attention, func(v ConditionView) bool {
			return v.Type == v1alpha1.ConditionProgressing && v.Reason == c.Reason && v.Message == c.Message
		})
	} else if c := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionProgressing); c != nil && c.Status == metav1.ConditionTrue {
		st.Rollout.WaitingFor, st.Rollout.WaitingMessage = c.Reason, c.Message
	}
	if r := s.Consumers; r != nil {
		st.Lag, st.DeadLettersLastHour, st.ReportedAt = r.Lag, r.DeadLettersLastHour, &r.UpdatedAt
		st.Waiting = Waiting{Messages: r.WaitingMessages, OldestSince: r.OldestWaitingSince, InstancesExpiringSoon: r.InstancesExpiringSoon,
			ByType: append([]v1alpha1.WaitingTypeStatus{}, r.WaitingByType...)}
		st.DeadLettersByReason = append(st.DeadLettersByReason, r.DeadLettersLastHourByReason...)
	}
	return st
}

// consumerPods lists the inbox's consumer pods by the selector its status reports (the scale
// subresource's); none before the operator wrote one.
func consumerPods(ctx context.Context, c *clients, inbox *v1alpha1.SequentialInbox) ([]corev1.Pod, error) {
	if inbox.Status.Selector == "" {
		return nil, nil
	}
	sel, err := labels.Parse(inbox.Status.Selector)
	if err != nil {
		return nil, fmt.Errorf("status.selector %q of SequentialInbox %s: %w", inbox.Status.Selector, inbox.Name, err)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(inbox.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("list the consumer pods of %s: %w", inbox.Name, err)
	}
	return pods.Items, nil
}

// consumersOf joins the pods with what the consumers reported, by name, sorted by name.
func consumersOf(inbox *v1alpha1.SequentialInbox, pods []corev1.Pod) []Consumer {
	byName := map[string]*Consumer{}
	for _, p := range pods {
		c := &Consumer{Name: p.Name, Phase: string(p.Status.Phase)}
		if p.DeletionTimestamp != nil {
			c.Phase = "Terminating"
		}
		for _, cs := range p.Status.ContainerStatuses {
			c.Restarts += cs.RestartCount
		}
		byName[p.Name] = c
	}
	if r := inbox.Status.Consumers; r != nil {
		for _, rp := range r.Pods {
			c, ok := byName[rp.Name]
			if !ok {
				c = &Consumer{Name: rp.Name, Phase: "Gone"}
				byName[rp.Name] = c
			}
			c.Reported, c.Ready, c.Reason, c.Partitions, c.Lag, c.Blocked, c.Unreachable =
				true, rp.Ready, rp.Reason, rp.Partitions, rp.Lag, rp.Blocked, rp.Unreachable
		}
	}
	out := make([]Consumer, 0, len(byName))
	for _, c := range byName {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Consumer) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// inboxEvents returns the latest events about the inbox, oldest first.
func inboxEvents(ctx context.Context, c *clients, inbox *v1alpha1.SequentialInbox) ([]Event, error) {
	var list corev1.EventList
	sel := fields.SelectorFromSet(fields.Set{"involvedObject.kind": "SequentialInbox", "involvedObject.name": inbox.Name})
	if err := c.List(ctx, &list, client.InNamespace(inbox.Namespace), client.MatchingFieldsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("list the events of %s: %w", inbox.Name, err)
	}
	events := make([]Event, 0, len(list.Items))
	for _, ev := range list.Items {
		if ev.InvolvedObject.UID != "" && ev.InvolvedObject.UID != inbox.UID {
			continue // an event of an earlier inbox of the same name
		}
		events = append(events, Event{Time: eventTime(&ev), Type: ev.Type, Reason: ev.Reason, Message: ev.Message, Count: max(ev.Count, 1)})
	}
	slices.SortStableFunc(events, func(a, b Event) int { return a.Time.Compare(b.Time.Time) })
	if len(events) > recentEvents {
		events = events[len(events)-recentEvents:]
	}
	return events, nil
}

// eventTime is when an event last happened, whichever API wrote it (core or events.k8s.io).
func eventTime(ev *corev1.Event) metav1.Time {
	t := ev.LastTimestamp
	if ev.Series != nil && ev.Series.LastObservedTime.After(t.Time) {
		t = metav1.NewTime(ev.Series.LastObservedTime.Time)
	}
	if ev.EventTime.After(t.Time) {
		t = metav1.NewTime(ev.EventTime.Time)
	}
	if t.IsZero() {
		t = ev.CreationTimestamp
	}
	return t
}

// age is the time from t to now as kubectl prints ages (5m, 3h, 2d).
func age(now time.Time, t time.Time) string {
	return duration.HumanDuration(now.Sub(t))
}

// renderStatus writes the status screen.
func renderStatus(w io.Writer, s screen, st *Status) {
	now := st.Now.Time
	ready, readyColour := "unknown (the operator has not reported yet)", colourYellow
	if r := st.Ready; r != nil {
		ready, readyColour = string(r.Status)+" ("+r.Reason+")", colourRed
		if r.Status == metav1.ConditionTrue {
			readyColour = colourGreen
		}
	}
	s.line(w, s.paint(colourBold, "SequentialInbox "+st.Namespace+"/"+st.Name)+"  Ready: "+s.paint(readyColour, ready))
	observed := fmt.Sprintf("generation %d", st.Generation)
	if st.ObservedGeneration != st.Generation {
		observed += fmt.Sprintf(" (the operator has reconciled %d)", st.ObservedGeneration)
	}
	reported := "no consumer report yet"
	if st.ReportedAt != nil {
		reported = "consumers reported " + age(now, st.ReportedAt.Time) + " ago"
	}
	s.line(w, fmt.Sprintf("%s; %d/%d consumers ready (spec %d); lag %d; %s", observed, st.Replicas.Ready, st.Replicas.Running, st.Replicas.Spec, st.Lag, reported))

	if len(st.Attention) > 0 {
		_, _ = fmt.Fprintln(w)
		s.line(w, s.paint(colourBold, "Needs attention"))
		rows := [][]cell{}
		for _, c := range st.Attention {
			colour := colourRed
			if c.Type == v1alpha1.ConditionProgressing || c.Type == v1alpha1.ConditionRolloutBlocked || c.Type == v1alpha1.ConditionScalingLimited {
				colour = colourYellow
			}
			rows = append(rows, []cell{{c.Type, ""}, {string(c.Status), colour}, {c.Reason, ""},
				{age(now, c.Since.Time), ""}, {c.Message, ""}})
		}
		s.table(w, "  ", rows)
	}

	_, _ = fmt.Fprintln(w)
	s.line(w, s.paint(colourBold, "Rollout")+" ("+string(st.Rollout.Strategy)+")")
	rows := [][]cell{
		{{"Running", ""}, {dash(st.Rollout.Running.Version), ""}, {"claim protocol " + dash(st.Rollout.Running.ClaimProtocol), ""}},
		{{"Target", ""}, {dash(st.Rollout.Target.Version), ""}, {"claim protocol " + dash(st.Rollout.Target.ClaimProtocol) + imageNote(st.Rollout.Target.Image), ""}},
		{{"Schema", ""}, {"version " + strconv.Itoa(int(st.Rollout.SchemaVersion)), ""}},
	}
	if r := st.Rollout; r.WaitingFor != "" {
		waits := r.WaitingFor + ": " + r.WaitingMessage
		if slices.ContainsFunc(st.Attention, func(v ConditionView) bool { return v.Reason == r.WaitingFor }) {
			waits = r.WaitingFor + " (above)"
		}
		rows = append(rows, []cell{{"Waits for", ""}, {waits, colourYellow}})
	}
	if st.Rollout.AwaitingApproval {
		rows = append(rows, []cell{{"Approve", ""}, {"kubectl seqinbox approve " + st.Name + " -n " + st.Namespace, colourBold}})
	}
	s.table(w, "  ", rows)

	_, _ = fmt.Fprintln(w)
	s.line(w, s.paint(colourBold, "Consumers"))
	if len(st.Consumers) == 0 {
		s.line(w, "  none run")
	} else {
		rows := [][]cell{{{"POD", ""}, {"PHASE", ""}, {"READY", ""}, {"RESTARTS", ""}, {"PARTITIONS", ""}, {"LAG", ""}, {"BLOCKED / NOT READY", ""}}}
		for _, c := range st.Consumers {
			readyText, readyColour := "no", colourRed
			if c.Ready {
				readyText, readyColour = "yes", colourGreen
			}
			if !c.Reported {
				readyText, readyColour = "?", colourYellow
			}
			rows = append(rows, []cell{{c.Name, ""}, {c.Phase, ""}, {readyText, readyColour}, {strconv.Itoa(int(c.Restarts)), ""},
				{dash(c.Partitions), ""}, {strconv.FormatInt(c.Lag, 10), ""}, consumerNote(now, c)})
		}
		s.table(w, "  ", rows)
	}

	_, _ = fmt.Fprintln(w)
	s.line(w, s.paint(colourBold, "Buffer and dead letters"))
	waiting := "not counted (no consumer leads housekeeping)"
	if m := st.Waiting.Messages; m != nil {
		waiting = strconv.FormatInt(*m, 10)
		if o := st.Waiting.OldestSince; o != nil && *m > 0 {
			waiting += ", the oldest waits for " + age(now, o.Time)
		}
	}
	expiring := "not counted"
	if n := st.Waiting.InstancesExpiringSoon; n != nil {
		expiring = strconv.FormatInt(*n, 10)
	}
	deadColour := ""
	if st.DeadLettersLastHour > 0 {
		deadColour = colourYellow
	}
	rows = [][]cell{{{"Waiting messages", ""}, {waiting, ""}}}
	for i, t := range st.Waiting.ByType {
		if i == shownPerList {
			rows = append(rows, []cell{{"", ""}, {more(len(st.Waiting.ByType)-i, "type"), ""}})
			break
		}
		count := strconv.FormatInt(t.Count, 10)
		if t.OldestSince != nil {
			count += ", the oldest waits for " + age(now, t.OldestSince.Time)
		}
		rows = append(rows, []cell{{"  " + t.Type, ""}, {count, ""}})
	}
	rows = append(rows,
		[]cell{{"Instances expiring soon", ""}, {expiring, ""}},
		[]cell{{"Dead letters, last hour", ""}, {strconv.FormatInt(st.DeadLettersLastHour, 10), deadColour}})
	for i, r := range st.DeadLettersByReason {
		if i == shownPerList {
			rows = append(rows, []cell{{"", ""}, {more(len(st.DeadLettersByReason)-i, "reason"), ""}})
			break
		}
		rows = append(rows, []cell{{"  " + r.Reason, ""}, {strconv.FormatInt(r.Count, 10), deadColour}})
	}
	s.table(w, "  ", rows)

	_, _ = fmt.Fprintln(w)
	s.line(w, s.paint(colourBold, "Events"))
	if len(st.Events) == 0 {
		s.line(w, "  none")
		return
	}
	rows = nil
	for _, ev := range st.Events {
		colour := ""
		if ev.Type == corev1.EventTypeWarning {
			colour = colourYellow
		}
		count := ""
		if ev.Count > 1 {
			count = "×" + strconv.Itoa(int(ev.Count))
		}
		rows = append(rows, []cell{{age(now, ev.Time.Time), ""}, {ev.Type, colour}, {ev.Reason, ""}, {count, ""}, {ev.Message, ""}})
	}
	s.table(w, "  ", rows)
}

// consumerNote is the last column of a consumer: its blocked record, why it is not ready, or
// why the operator could not read it.
func consumerNote(now time.Time, c Consumer) cell {
	var notes []string
	colour := ""
	if b := c.Blocked; b != nil {
		notes = append(notes, fmt.Sprintf("%s[%d]@%d retried for %s: %s", b.Topic, b.Partition, b.Offset, age(now, b.Since.Time), b.Error))
		colour = colourRed
	}
	if c.Reported && !c.Ready && c.Reason != "" {
		notes = append(notes, "not ready: "+c.Reason)
		colour = cmp.Or(colour, colourYellow)
	}
	if c.Unreachable != "" {
		notes = append(notes, "unreachable: "+c.Unreachable)
		colour = cmp.Or(colour, colourYellow)
	}
	if !c.Reported && c.Unreachable == "" {
		notes = append(notes, "not reported yet")
	}
	if len(notes) == 0 {
		return cell{"-", ""}
	}
	return cell{strings.Join(notes, "; "), colour}
}

// more says how many of a list the screen leaves out, and where they are.
func more(n int, what string) string {
	if n != 1 {
		what += "s"
	}
	return fmt.Sprintf("%d more %s (-o yaml lists them)", n, what)
}

// dash is s, or "-" when it is empty.
func dash(s string) string { return cmp.Or(s, "-") }

// imageNote names the target image in parentheses, when known.
func imageNote(image string) string {
	if image == "" {
		return ""
	}
	return " (" + image + ")"
}
