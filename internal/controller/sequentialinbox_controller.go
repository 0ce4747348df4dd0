package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// +kubebuilder:rbac:groups=inbox.seqinbox.dev,resources=sequentialinboxes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=inbox.seqinbox.dev,resources=sequentialinboxes/status,verbs=get;patch
// +kubebuilder:rbac:groups=inbox.seqinbox.dev,resources=sequentialinboxes/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Options configure a Reconciler; zero values take the defaults.
type Options struct {
	// DefaultImage runs when spec.image is empty: the operator's own release.
	DefaultImage string
	// Groups inspects Kafka consumer groups; default KafkaGroups.
	Groups GroupInspector
	// Clock is the time of every time-based decision (backoff, rechecks); default the real clock.
	Clock clock.PassiveClock
	// RetryBase is the wait after a failed Job, doubled per further failure up to RetryMax.
	RetryBase, RetryMax time.Duration
	// PollInterval is how often what no watch reports (Kafka group, Secrets) is read again.
	PollInterval time.Duration
	// StatePollInterval is how often the operator reads the state of each running consumer;
	// StatusWriteInterval is the least time between two writes of status.consumers;
	// BlockedThreshold is how long a consumer may retry a record before the inbox is Degraded
	// (PartitionBlocked). Defaults 10 seconds, 30 seconds and five minutes.
	StatePollInterval, StatusWriteInterval, BlockedThreshold time.Duration
	// MaxConcurrentReconciles is how many inboxes are reconciled at once; default 4 (a pass
	// mostly waits for the API server and Kafka).
	MaxConcurrentReconciles int
}

// Reconciler reconciles SequentialInbox resources.
type Reconciler struct {
	// Client reads through the manager's cache and writes to the API server.
	Client client.Client
	// APIReader reads Secrets directly, so that no Secret is cached.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Options
	// reads is what the operator last read from the consumers of each inbox.
	reads consumerReads
	// retired records the inboxes whose Jobs of older operators were removed (retired.go).
	retired retiredJobs
}

// NewReconciler builds a Reconciler from its dependencies, filling in default options.
func NewReconciler(c client.Client, apiReader client.Reader, recorder events.EventRecorder, opts Options) *Reconciler {
	if opts.Groups == nil {
		opts.Groups = KafkaGroups{}
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.RetryBase == 0 {
		opts.RetryBase = 10 * time.Second
	}
	if opts.RetryMax == 0 {
		opts.RetryMax = 5 * time.Minute
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 10 * time.Second
	}
	if opts.StatePollInterval == 0 {
		opts.StatePollInterval = 10 * time.Second
	}
	if opts.StatusWriteInterval == 0 {
		opts.StatusWriteInterval = 30 * time.Second
	}
	if opts.BlockedThreshold == 0 {
		opts.BlockedThreshold = 5 * time.Minute
	}
	if opts.MaxConcurrentReconciles == 0 {
		opts.MaxConcurrentReconciles = 4
	}
	return &Reconciler{Client: c, APIReader: apiReader, Recorder: recorder, Options: opts}
}

// Setup registers the SequentialInbox Reconciler and the SequentialInboxAction reconciler with
// the manager, using the manager's client, API reader and an event recorder named after the operator.
func Setup(mgr ctrl.Manager, opts Options) error {
	r := NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder(fieldOwner), opts)
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	return NewActionReconciler(r).SetupWithManager(mgr)
}

// CacheOptions limit the manager's cache to the objects the operator created (by their
// managed-by label), so that its memory does not grow with the cluster's pods and ConfigMaps.
func CacheOptions() cache.Options {
	managed := cache.ByObject{Label: managedSelector()}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:                   managed,
		&corev1.ConfigMap{}:             managed,
		&corev1.Service{}:               managed,
		&batchv1.Job{}:                  managed,
		&appsv1.Deployment{}:            managed,
		&policyv1.PodDisruptionBudget{}: managed,
	}}
}

// SetupWithManager watches the inboxes (spec, annotations, deletion), everything they own, and
// the pods of their consumers and Jobs, and runs the poller of the consumers' state, which asks
// for a pass when what the consumers report would change the status.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	passes := make(chan event.GenericEvent)
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		r.pollLoop(ctx, passes)
		return nil
	})); err != nil {
		return fmt.Errorf("add the consumer state poller: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("sequentialinbox").
		WithOptions(controller.Options{MaxConcurrentReconciles: r.MaxConcurrentReconciles}).
		For(&v1alpha1.SequentialInbox{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}, deletionStarted()))).
		Owns(&appsv1.Deployment{}).
		Owns(&batchv1.Job{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToInbox)).
		WatchesRawSource(source.Channel(passes, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

// deletionStarted passes the update that sets the deletion timestamp.
func deletionStarted() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp() == nil && e.ObjectNew.GetDeletionTimestamp() != nil
	}}
}

// podToInbox maps a consumer or Job pod to its inbox.
func podToInbox(_ context.Context, obj client.Object) []reconcile.Request {
	l := obj.GetLabels()
	if l[labelManagedBy] != managedBy || l[labelInstance] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: obj.GetNamespace(), Name: l[labelInstance]}}}
}

// phaseFunc is one step of a pass; see reconcilePhases.
type phaseFunc func(ctx context.Context, s *scope) (phaseResult, error)

// Reconcile is the outer reconcile: it fetches the inbox, handles the finalizer, runs either the
// phases or the deletion, and writes the status once, at the end, for both.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	inbox := &v1alpha1.SequentialInbox{}
	if err := r.Client.Get(ctx, req.NamespacedName, inbox); err != nil {
		if apierrors.IsNotFound(err) {
			r.reads.forget(req.NamespacedName)
			r.retired.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	deleting := !inbox.DeletionTimestamp.IsZero()
	switch {
	case deleting && !controllerutil.ContainsFinalizer(inbox, finalizerName):
		return ctrl.Result{}, nil
	case !deleting && !controllerutil.ContainsFinalizer(inbox, finalizerName):
		before := inbox.DeepCopy()
		controllerutil.AddFinalizer(inbox, finalizerName)
		if err := r.Client.Patch(ctx, inbox, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}
	s, err := r.observe(ctx, inbox)
	if err != nil {
		return ctrl.Result{}, err
	}
	before := inbox.DeepCopy()
	defer func() {
		if s.finalized {
			// The finalizer is gone, and so may be the inbox: there is no status left to write.
			return
		}
		if !deleting {
			summarize(s)
		}
		exportConditions(s.inbox)
		result, err = r.patchStatus(ctx, before, s.inbox, result, err)
	}()
	if deleting {
		return r.reconcileDelete(ctx, s)
	}
	return r.reconcilePhases(ctx, s)
}

// reconcilePhases is the inner reconcile: the phases in order, each of which lets the pass go
// on, stops it to wait, or fails it. The generation counts as observed only when every phase ran.
func (r *Reconciler) reconcilePhases(ctx context.Context, s *scope) (ctrl.Result, error) {
	phases := []phaseFunc{r.removeRetiredJobs, r.validate, r.renderConfig, r.probeTarget, r.gateRollout, r.migrateSchema, r.planReplicas, r.ensureWorkload, r.watchGroup, r.reportConsumers}
	for _, phase := range phases {
		res, err := phase(ctx, s)
		if err != nil {
			return ctrl.Result{}, err
		}
		if res.stop {
			return ctrl.Result{RequeueAfter: res.requeueAfter}, nil
		}
	}
	s.inbox.Status.ObservedGeneration = s.inbox.Generation
	return ctrl.Result{RequeueAfter: s.recheck}, nil
}

// observe reads what runs: the consumer Deployment and the consumer pods.
func (r *Reconciler) observe(ctx context.Context, inbox *v1alpha1.SequentialInbox) (*scope, error) {
	s := &scope{inbox: inbox, now: r.Clock.Now(), image: inbox.Spec.Image}
	if s.image == "" {
		s.image = r.DefaultImage
	}
	var d appsv1.Deployment
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: inbox.Namespace, Name: deploymentName(inbox)}, &d)
	switch {
	case err == nil:
		s.deployment = &d
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get deployment: %w", err)
	}
	s.running = runningEngine(s.deployment)
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(inbox.Namespace),
		client.MatchingLabels(selectorLabels(inbox, componentConsumer))); err != nil {
		return nil, fmt.Errorf("list consumer pods: %w", err)
	}
	s.consumerPods = pods.Items
	return s, nil
}

// reconcileDelete is the inner reconcile of a deleted inbox: it stops the consumers and keeps the
// inbox until their pods are gone (saying so in Ready and Progressing, which the outer reconcile
// writes); the database and its contents stay.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	if err := r.stopConsumers(ctx, s, "the SequentialInbox is being deleted"); err != nil {
		return ctrl.Result{}, err
	}
	if len(s.consumerPods) > 0 {
		message := fmt.Sprintf("Waiting for %d consumer pod(s) to terminate before the SequentialInbox goes: %v.",
			len(s.consumerPods), podNames(s.consumerPods))
		s.setCondition(condition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.DeletingReason, message))
		s.setCondition(condition(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.DeletingReason, message))
		return ctrl.Result{RequeueAfter: r.PollInterval}, nil
	}
	before := s.inbox.DeepCopy()
	controllerutil.RemoveFinalizer(s.inbox, finalizerName)
	if err := r.Client.Patch(ctx, s.inbox, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("remove finalizer: %w", err)
	}
	s.finalized = true
	r.reads.forget(client.ObjectKeyFromObject(s.inbox))
	r.retired.forget(client.ObjectKeyFromObject(s.inbox))
	forgetConditions(s.inbox)
	r.event(s.inbox, corev1.EventTypeNormal, "ConsumersStopped", "Delete", "The consumers stopped; the database and its contents stay")
	return ctrl.Result{}, nil
}

// patchStatus writes the status when it changed, with an optimistic lock: a pass that computed
// its status from a stale read must not overwrite a newer one. The conflict is returned like any
// error, so the work queue runs the pass again after its rate limiter's backoff. Condition
// transitions are reported as Events.
func (r *Reconciler) patchStatus(ctx context.Context, before, inbox *v1alpha1.SequentialInbox, result ctrl.Result, passErr error) (ctrl.Result, error) {
	if equality.Semantic.DeepEqual(before.Status, inbox.Status) {
		return result, passErr
	}
	r.reportTransitions(before, inbox)
	err := r.Client.Status().Patch(ctx, inbox, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	if err == nil {
		return result, passErr
	}
	return ctrl.Result{}, errors.Join(passErr, fmt.Errorf("patch status: %w", err))
}

// reportedConditions change rarely enough that each transition is worth an Event.
var reportedConditions = []string{
	v1alpha1.ConditionConfigValid, v1alpha1.ConditionSchemaReady, v1alpha1.ConditionRolloutBlocked,
	v1alpha1.ConditionDegraded, v1alpha1.ConditionReady,
}

// reportTransitions records an Event for every reported condition whose status or reason changed.
func (r *Reconciler) reportTransitions(before, after *v1alpha1.SequentialInbox) {
	for _, typ := range reportedConditions {
		now := meta.FindStatusCondition(after.Status.Conditions, typ)
		if now == nil {
			continue
		}
		was := meta.FindStatusCondition(before.Status.Conditions, typ)
		if was != nil && was.Status == now.Status && was.Reason == now.Reason {
			continue
		}
		eventType := corev1.EventTypeNormal
		if warns(*now) {
			eventType = corev1.EventTypeWarning
		}
		r.event(after, eventType, now.Reason, typ+"="+string(now.Status), "%s", now.Message)
	}
}

// warns says which condition states are Warning events.
func warns(c metav1.Condition) bool {
	switch c.Type {
	case v1alpha1.ConditionConfigValid, v1alpha1.ConditionSchemaReady:
		return c.Status == metav1.ConditionFalse && c.Reason != v1alpha1.MigrationRunningReason
	case v1alpha1.ConditionDegraded:
		return c.Status == metav1.ConditionTrue
	}
	return false
}

// maxEventNote is the API's limit of an Event's note.
const maxEventNote = 1024

// event records an Event about the inbox.
func (r *Reconciler) event(obj runtime.Object, eventType, reason, action, format string, args ...any) {
	note := fmt.Sprintf(format, args...)
	if len(note) > maxEventNote {
		note = note[:maxEventNote-3] + "..."
	}
	r.Recorder.Eventf(obj, nil, eventType, reason, action, "%s", note)
}
