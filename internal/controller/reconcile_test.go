package controller

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/migrations"
)

func TestValidInboxIsProbedMigratedAndRunUntilReady(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)

	// Pass 1: finalizer, configuration, and a probe of the default image; nothing runs yet.
	h.reconcile("orders")
	inbox := h.get("orders")
	if !controllerutil.ContainsFinalizer(inbox, finalizerName) {
		t.Fatal("no finalizer: deleting the inbox would not stop its consumers first")
	}
	h.expectCondition("orders", v1alpha1.ConditionConfigValid, metav1.ConditionTrue, v1alpha1.ValidReason)
	h.expectCondition("orders", v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ProbingTargetImageReason, imageV1)
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ProbingTargetImageReason)
	var cm corev1.ConfigMap
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: configMapName(inbox, inbox.Status.ConfigHash)}, &cm))
	rendered, err := manifest.Parse([]byte(cm.Data[configKey]))
	if err != nil {
		t.Fatalf("the consumer cannot read the rendered configuration: %v", err)
	}
	if rendered.Name != "orders" || len(rendered.Spec.Sequences) != 2 || rendered.Spec.Kafka.ConsumerGroup != inbox.Spec.Kafka.ConsumerGroup {
		t.Errorf("rendered manifest = %+v, want the inbox's spec", rendered)
	}
	if cm.Immutable == nil || !*cm.Immutable {
		t.Error("the rendered ConfigMap is mutable; running pods could see a configuration the gate holds back")
	}
	probe := h.onlyJob("orders", componentProbe)
	if got := probe.Spec.Template.Spec.Containers[0].Image; got != imageV1 {
		t.Errorf("probe image = %s, want the default image %s", got, imageV1)
	}
	if len(h.jobs("orders", componentMigration)) != 0 {
		t.Fatal("a migration started before the target image's protocol was known")
	}
	h.noDeployment("orders")

	// The probe reports; the gate has nothing to stop; the migration Job starts.
	h.completeJob(probe)
	h.reconcile("orders")
	inbox = h.get("orders")
	if inbox.Status.TargetEngineVersion != "v1.0.0" || inbox.Status.TargetClaimProtocol != "insert-first-v1" {
		t.Errorf("target = %s/%s, want v1.0.0/insert-first-v1", inbox.Status.TargetEngineVersion, inbox.Status.TargetClaimProtocol)
	}
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse, v1alpha1.NoOtherConsumersReason)
	h.expectCondition("orders", v1alpha1.ConditionSchemaReady, metav1.ConditionFalse, v1alpha1.MigrationRunningReason)
	migration := h.onlyJob("orders", componentMigration)
	if args := strings.Join(migration.Spec.Template.Spec.Containers[0].Args, " "); strings.Contains(args, "--dry-run") {
		t.Errorf("migration args %q are a dry run", args)
	}
	h.noDeployment("orders")

	// The migration reports; the Deployment, PDB and Service appear.
	h.completeJob(migration)
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionSchemaReady, metav1.ConditionTrue, v1alpha1.MigratedReason, "Schema version 3")
	d := h.deployment("orders")
	if d.Spec.Template.Annotations[annotationConfigHash] != inbox.Status.ConfigHash {
		t.Errorf("pod template config hash = %q, want %q", d.Spec.Template.Annotations[annotationConfigHash], inbox.Status.ConfigHash)
	}
	if *d.Spec.Replicas != 2 || d.Spec.Template.Spec.Containers[0].Image != imageV1 {
		t.Errorf("deployment = %d × %s, want 2 × %s", *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Image, imageV1)
	}
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "orders-consumer"}, &policyv1.PodDisruptionBudget{}))
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "orders-metrics"}, &corev1.Service{}))
	inbox = h.get("orders")
	if inbox.Status.ObservedGeneration != inbox.Generation {
		t.Errorf("observedGeneration = %d after a complete pass, want %d", inbox.Status.ObservedGeneration, inbox.Generation)
	}
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ConsumersUnavailableReason)
	h.expectCondition("orders", v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.RollingOutReason)

	// The Deployment controller (played) makes the consumers available.
	h.rollOut("orders")
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason, "2 of 2", "v1.0.0", "insert-first-v1")
	h.expectCondition("orders", v1alpha1.ConditionProgressing, metav1.ConditionFalse, v1alpha1.ReconciledReason)
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason)
	inbox = h.get("orders")
	st := inbox.Status
	if st.RunningEngineVersion != "v1.0.0" || st.RunningClaimProtocol != "insert-first-v1" || st.SchemaVersion != 3 || st.ReplicasReady != 2 {
		t.Errorf("status = %+v, want running v1.0.0/insert-first-v1, schema 3, 2 ready", st)
	}
	for _, c := range st.Conditions {
		if c.ObservedGeneration != inbox.Generation {
			t.Errorf("condition %s observed generation %d, want %d", c.Type, c.ObservedGeneration, inbox.Generation)
		}
	}
	if notes := h.events("orders", v1alpha1.ConsumersReadyReason); len(notes) == 0 {
		t.Error("no Event reported the transition to Ready")
	}
}

func TestInvalidSpecsLeaveTheRunningConsumersUntouched(t *testing.T) {
	cases := []struct {
		name      string
		edit      func(*v1alpha1.SequentialInboxSpec)
		wantField string
		// wantValue, when set, is the offending value the message names too.
		wantValue string
	}{
		{name: "cycle", wantField: "spec.sequences[0].messages[0].releaseCondition", edit: func(s *v1alpha1.SequentialInboxSpec) {
			s.Sequences[0].Messages[0].ReleaseCondition = &v1alpha1.ReleaseCondition{Predecessor: "OrderShipped"}
		}},
		{name: "unknown predecessor", wantField: "spec.sequences[0].messages[1].releaseCondition.predecessor", edit: func(s *v1alpha1.SequentialInboxSpec) {
			s.Sequences[0].Messages[1].ReleaseCondition = &v1alpha1.ReleaseCondition{Predecessor: "OrderCancelled"}
		}},
		{name: "type in two sequences", wantField: "spec.sequences[1].messages[2].type", edit: func(s *v1alpha1.SequentialInboxSpec) {
			s.Sequences[1].Messages = append(s.Sequences[1].Messages, v1alpha1.MessageSpec{Type: "OrderPaid"})
		}},
		{name: "pools over the connection budget", wantField: "spec.database.poolSize", edit: func(s *v1alpha1.SequentialInboxSpec) {
			s.Database.PoolSize, s.Database.ConnectionBudget = 20, ptr.To(int32(20)) // one consumer's 20 + the Job's 1 > 20
		}},
		{name: "credential header forwarded", wantField: "spec.sink.forwardHeaders[1]", wantValue: "Authorization", edit: func(s *v1alpha1.SequentialInboxSpec) {
			s.Sink.ForwardHeaders = []string{"x-tenant", "Authorization"} // the CRD pattern admits any token
		}},
		{name: "attribute header forwarded", wantField: "spec.sink.forwardHeaders[0]", wantValue: "ce-type", edit: func(s *v1alpha1.SequentialInboxSpec) {
			s.Sink.ForwardHeaders = []string{"ce-type"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.create("orders", nil)
			h.bringUp("orders")
			before := h.deployment("orders")
			valid := h.get("orders")
			jobsBefore := len(h.jobs("orders", componentProbe)) + len(h.jobs("orders", componentMigration))
			var cmsBefore corev1.ConfigMapList
			h.must(k8s.List(h.ctx, &cmsBefore, client.InNamespace(h.ns)))

			h.update("orders", func(in *v1alpha1.SequentialInbox) { tc.edit(&in.Spec) })
			res := h.reconcile("orders")

			h.expectCondition("orders", v1alpha1.ConditionConfigValid, metav1.ConditionFalse, v1alpha1.InvalidSpecReason, tc.wantField, tc.wantValue)
			h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.InvalidSpecReason)
			h.expectCondition("orders", v1alpha1.ConditionProgressing, metav1.ConditionFalse, v1alpha1.InvalidSpecReason)
			if res.RequeueAfter != 0 {
				t.Errorf("an invalid spec requeues after %s; only a spec change can fix it", res.RequeueAfter)
			}
			after := h.deployment("orders")
			if after.ResourceVersion != before.ResourceVersion {
				t.Errorf("the Deployment changed (resourceVersion %s → %s) although the spec is invalid", before.ResourceVersion, after.ResourceVersion)
			}
			if jobs := len(h.jobs("orders", componentProbe)) + len(h.jobs("orders", componentMigration)); jobs != jobsBefore {
				t.Errorf("%d Jobs after the invalid spec, %d before", jobs, jobsBefore)
			}
			var cmsAfter corev1.ConfigMapList
			h.must(k8s.List(h.ctx, &cmsAfter, client.InNamespace(h.ns)))
			if len(cmsAfter.Items) != len(cmsBefore.Items) {
				t.Errorf("%d ConfigMaps after the invalid spec, %d before: an invalid configuration was rendered", len(cmsAfter.Items), len(cmsBefore.Items))
			}
			inbox := h.get("orders")
			if inbox.Status.ObservedGeneration != valid.Generation {
				t.Errorf("observedGeneration = %d, want the last valid generation %d", inbox.Status.ObservedGeneration, valid.Generation)
			}
			if notes := h.events("orders", v1alpha1.InvalidSpecReason); len(notes) == 0 || !strings.Contains(strings.Join(notes, " "), tc.wantField) {
				t.Errorf("Events %q do not name %s", notes, tc.wantField)
			}
		})
	}
}

func TestPollIntervalShorterThanTheWorstCaseDegradesButRuns(t *testing.T) {
	h := newHarness(t)
	h.create("orders", func(in *v1alpha1.SequentialInbox) {
		in.Spec.Kafka.MaxPollIntervalMs = 60000 // 3 messages × 4 attempts × 10s > 60s
		in.Spec.Sink.Timeout = v1alpha1.Duration{Duration: 10 * time.Second}
	})
	h.bringUp("orders")
	h.expectCondition("orders", v1alpha1.ConditionConfigValid, metav1.ConditionTrue, v1alpha1.ValidReason)
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.MaxPollIntervalTooShortReason, "spec.kafka.maxPollIntervalMs")
}

func TestMissingDatabaseSecretIsReportedAndNothingStarts(t *testing.T) {
	h := newHarness(t)
	h.create("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Database.URLSecretRef.Name = "elsewhere" })
	h.reconcile("orders")
	h.completeJob(h.onlyJob("orders", componentProbe))
	res := h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionSchemaReady, metav1.ConditionFalse, v1alpha1.DatabaseSecretMissingReason, "elsewhere")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.DatabaseSecretMissingReason)
	if res.RequeueAfter != testPollInterval {
		t.Errorf("requeue after %s, want %s: no watch reports a new Secret", res.RequeueAfter, testPollInterval)
	}
	if len(h.jobs("orders", componentMigration)) != 0 {
		t.Error("a migration Job started without its database Secret")
	}
	h.noDeployment("orders")
}

func TestFailedMigrationIsRetriedWithANewJobAfterExponentialBackoff(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.reconcile("orders")
	h.completeJob(h.onlyJob("orders", componentProbe))
	h.reconcile("orders")
	first := h.onlyJob("orders", componentMigration)

	// The first attempt fails: the Job's reason and the report's error are reported.
	h.failJob(first, `{"schemaVersion":1,"applied":[],"pending":[2,3],"claimProtocol":"insert-first-v1","engineVersion":"v1.0.0","liveConsumers":[],"error":"migration 2: permission denied for schema public"}`)
	res := h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionSchemaReady, metav1.ConditionFalse, v1alpha1.MigrationFailedReason,
		first.Name, "BackoffLimitExceeded", "permission denied for schema public", "Attempt 2 starts in 10s")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.MigrationFailedReason)
	if res.RequeueAfter != testRetryBase {
		t.Errorf("requeue after %s, want the backoff %s", res.RequeueAfter, testRetryBase)
	}
	st := h.get("orders").Status.Migration
	if st.Attempt != 2 || st.Failures != 1 {
		t.Errorf("migration status = %+v, want attempt 2 after 1 failure", st)
	}

	// Before the backoff ends nothing new starts.
	h.clock.Step(testRetryBase - time.Second)
	if res := h.reconcile("orders"); res.RequeueAfter != time.Second {
		t.Errorf("requeue after %s, want the rest of the backoff (1s)", res.RequeueAfter)
	}
	if n := len(h.jobs("orders", componentMigration)); n != 1 {
		t.Fatalf("%d migration Jobs during the backoff, want 1", n)
	}

	// After it, a new Job (new name) runs; its failure doubles the wait.
	h.clock.Step(time.Second)
	h.reconcile("orders")
	second := h.onlyJob("orders", componentMigration)
	if second.Name == first.Name || second.Annotations[annotationAttempt] != "2" {
		t.Fatalf("second attempt is Job %s (attempt %s), want a new Job for attempt 2", second.Name, second.Annotations[annotationAttempt])
	}
	h.failJob(second, "dial tcp 10.0.0.5:5432: connect: connection refused")
	if res := h.reconcile("orders"); res.RequeueAfter != 2*testRetryBase {
		t.Errorf("requeue after %s, want the doubled backoff %s", res.RequeueAfter, 2*testRetryBase)
	}
	h.expectCondition("orders", v1alpha1.ConditionSchemaReady, metav1.ConditionFalse, v1alpha1.MigrationFailedReason, "connection refused", "failed 2 time(s)")
	h.noDeployment("orders")

	// The third attempt succeeds: the schema is ready, failed Jobs are cleaned up, consumers start.
	h.clock.Step(2 * testRetryBase)
	h.reconcile("orders")
	third := h.onlyJob("orders", componentMigration)
	h.completeJob(third)
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionSchemaReady, metav1.ConditionTrue, v1alpha1.MigratedReason, third.Name)
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason)
	if st := h.get("orders").Status.Migration; st.Failures != 0 || !st.Succeeded || st.Attempt != 3 {
		t.Errorf("migration status = %+v, want attempt 3 succeeded, failures reset", st)
	}
	if jobs := h.jobs("orders", componentMigration); len(jobs) != 1 || jobs[0].Name != third.Name {
		t.Errorf("migration Jobs %v remain, want only the successful %s", jobNames(jobs), third.Name)
	}
	h.deployment("orders")
	if notes := h.events("orders", "JobFailed"); len(notes) < 2 {
		t.Errorf("%d JobFailed Events, want one per failed attempt", len(notes))
	}
}

func TestFailedProbeIsRetriedAndBlocksEverythingAfterIt(t *testing.T) {
	h := newHarness(t)
	h.create("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Image = "registry.example/seqinbox:missing" })
	h.reconcile("orders")
	probe := h.onlyJob("orders", componentProbe)
	h.failJob(probe, "exec format error")
	res := h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ProbeFailedReason, "exec format error")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ProbeFailedReason)
	if res.RequeueAfter != testRetryBase {
		t.Errorf("requeue after %s, want %s", res.RequeueAfter, testRetryBase)
	}
	h.clock.Step(testRetryBase)
	h.reconcile("orders")
	if retry := h.onlyJob("orders", componentProbe); retry.Name == probe.Name {
		t.Error("the probe was not retried with a new Job")
	}
	if len(h.jobs("orders", componentMigration)) != 0 {
		t.Error("a migration ran from an image whose protocol is unknown")
	}
	h.noDeployment("orders")
}

func TestCompatibleUpgradeMigratesAndRollsWithoutStoppingTheConsumers(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	generationBefore := h.deployment("orders").Generation
	h.update("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Image = imageV1Patch })

	h.reconcile("orders")
	h.completeJob(h.onlyJob("orders", componentProbe))
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse, v1alpha1.SameClaimProtocolReason, "insert-first-v1")
	migration := h.onlyJob("orders", componentMigration)
	if got := migration.Spec.Template.Spec.Containers[0].Image; got != imageV1Patch {
		t.Errorf("migration image = %s, want the target %s", got, imageV1Patch)
	}
	if d := h.deployment("orders"); *d.Spec.Replicas != 2 || d.Spec.Template.Spec.Containers[0].Image != imageV1 {
		t.Errorf("while migrating, deployment = %d × %s; the old consumers must keep running", *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Image)
	}
	h.completeJob(migration)
	h.reconcile("orders")
	d := h.deployment("orders")
	if *d.Spec.Replicas != 2 || d.Spec.Template.Spec.Containers[0].Image != imageV1Patch || d.Spec.Template.Annotations[annotationEngineVersion] != "v1.0.1" {
		t.Errorf("deployment = %d × %s (%s), want 2 × %s", *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Image,
			d.Spec.Template.Annotations[annotationEngineVersion], imageV1Patch)
	}
	h.rollOut("orders")
	h.reconcile("orders")
	var cms corev1.ConfigMapList
	h.must(k8s.List(h.ctx, &cms, client.InNamespace(h.ns), client.MatchingLabels{labelInstance: "orders"}))
	if current := h.get("orders").Status.ConfigHash; len(cms.Items) != 1 || cms.Items[0].Annotations[annotationConfigHash] != current {
		t.Errorf("after the rollout %d rendered ConfigMaps remain, want only the current one", len(cms.Items))
	}
	// One change of the Deployment: the new template. Scaling to 0 and back would be two more.
	if d.Generation != generationBefore+1 {
		t.Errorf("deployment generation %d → %d: a compatible upgrade must only roll the template", generationBefore, d.Generation)
	}
}

func TestIncompatibleUpgradeStopsOldConsumersAndWaitsForTheGroupToEmpty(t *testing.T) {
	h := newHarness(t)
	inbox := h.create("orders", nil)
	h.bringUp("orders")
	oldConfigMap := h.get("orders").Status.ConfigHash
	pods := h.startConsumerPods("orders", 2)
	member := joinGroup(t, h.seeds, inbox.Spec.Kafka.ConsumerGroup, "old-consumer")

	h.update("orders", func(in *v1alpha1.SequentialInbox) {
		in.Spec.Image = imageV2
		in.Spec.Replicas = ptr.To(int32(3))
	})
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ProbingTargetImageReason, imageV2)
	if d := h.deployment("orders"); *d.Spec.Replicas != 2 {
		t.Fatalf("the consumers were touched (replicas %d) before the target's protocol was known", *d.Spec.Replicas)
	}
	h.completeJob(h.onlyJob("orders", componentProbe))

	// Another claim protocol: stop the old consumers and wait for their pods.
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.WaitingForOldPodsReason, pods[0], pods[1])
	d := h.deployment("orders")
	if *d.Spec.Replicas != 0 || d.Spec.Template.Spec.Containers[0].Image != imageV1 {
		t.Fatalf("deployment = %d × %s, want the old version scaled to 0", *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Image)
	}
	if !strings.Contains(d.Spec.Template.Spec.Volumes[0].Projected.Sources[0].ConfigMap.Name, oldConfigMap[:10]) {
		t.Error("the stopped Deployment was given the new configuration")
	}
	if notes := h.events("orders", "StoppingConsumers"); len(notes) != 1 || !strings.Contains(notes[0], "insert-first-v2") {
		t.Errorf("StoppingConsumers Events = %q, want one naming the new protocol", notes)
	}

	// The pods are gone; a member of the old version is still in the group.
	h.deletePods(pods...)
	res := h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.WaitingForConsumerGroupReason, "client old-consumer")
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.WaitingForConsumerGroupReason)
	if res.RequeueAfter != testPollInterval {
		t.Errorf("requeue after %s, want %s: no watch reports Kafka", res.RequeueAfter, testPollInterval)
	}
	if len(h.jobsOfImage("orders", componentMigration, imageV2)) != 0 {
		t.Fatal("the migration of the new version started while an old consumer is in the group")
	}

	// The member leaves: a probe taken after the stop reads the registry.
	member.Close()
	waitForMembers(t, h.seeds, inbox.Spec.Kafka.ConsumerGroup, func(m []GroupMember) bool { return len(m) == 0 })
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.CheckingRegistryReason)
	check := h.onlyJob("orders", componentProbe)
	if check.Annotations[annotationConsumersStopped] != "true" {
		t.Fatalf("registry probe %s was not taken after the stop", check.Name)
	}
	h.completeJob(check)

	// Nothing old is left: migrate with the new image, then start it.
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse, v1alpha1.NoOtherConsumersReason)
	migration := h.onlyJob("orders", componentMigration)
	if got := migration.Spec.Template.Spec.Containers[0].Image; got != imageV2 {
		t.Errorf("migration image = %s, want %s", got, imageV2)
	}
	if d := h.deployment("orders"); *d.Spec.Replicas != 0 {
		t.Fatalf("the new version started before its migration (replicas %d)", *d.Spec.Replicas)
	}
	h.completeJob(migration)
	h.reconcile("orders")
	d = h.deployment("orders")
	if *d.Spec.Replicas != 3 || d.Spec.Template.Spec.Containers[0].Image != imageV2 || d.Spec.Template.Annotations[annotationClaimProtocol] != "insert-first-v2" {
		t.Fatalf("deployment = %d × %s, want 3 × %s", *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Image, imageV2)
	}
	h.rollOut("orders")
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason, "v2.0.0", "insert-first-v2")
	if st := h.get("orders").Status; st.RunningClaimProtocol != "insert-first-v2" || st.TargetClaimProtocol != "insert-first-v2" {
		t.Errorf("status running/target = %s/%s, want insert-first-v2", st.RunningClaimProtocol, st.TargetClaimProtocol)
	}
}

func TestLiveOldConsumerInTheRegistryBlocksUntilItIsGone(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	h.update("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Image = imageV2 })
	h.reconcile("orders")
	h.completeJob(h.onlyJob("orders", componentProbe))
	h.reconcile("orders") // scaled to 0; no pods, no group member: the registry is read
	check := h.onlyJob("orders", componentProbe)

	// An old consumer outside the cluster (say, `seqinbox consume` on a laptop) still heartbeats.
	laptop := migrations.LiveConsumer{InstanceID: "laptop-7", ConsumerGroup: "orders", EngineVersion: "v1.0.0",
		ClaimProtocol: "insert-first-v1", HeartbeatAt: h.clock.Now()}
	h.completeJob(check, laptop)
	res := h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.WaitingForRegistryReason, "laptop-7", "insert-first-v1")
	if res.RequeueAfter != testPollInterval {
		t.Errorf("requeue after %s, want a registry read again after %s", res.RequeueAfter, testPollInterval)
	}

	// Until the next read is due, and while it runs, the last finding stands and nothing migrates.
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.WaitingForRegistryReason, "laptop-7")
	h.clock.Step(testPollInterval)
	h.reconcile("orders")
	recheck := h.onlyJob("orders", componentProbe)
	if recheck.Name == check.Name {
		t.Fatal("the registry was not read again")
	}
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.WaitingForRegistryReason, "laptop-7")
	if len(h.jobsOfImage("orders", componentMigration, imageV2)) != 0 {
		t.Fatal("migrated while an old consumer is live in the registry")
	}

	// The laptop's heartbeat expired: the rollout proceeds.
	h.completeJob(recheck)
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse, v1alpha1.NoOtherConsumersReason)
	h.onlyJob("orders", componentMigration)
}

func TestSupervisedUpgradeWaitsForApprovalBeforeStoppingTheConsumers(t *testing.T) {
	h := newHarness(t)
	h.create("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.UpgradeStrategy = v1alpha1.UpgradeSupervised })
	h.bringUp("orders")
	h.update("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Image = imageV2 })
	h.reconcile("orders")
	h.completeJob(h.onlyJob("orders", componentProbe))

	res := h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.AwaitingApprovalReason,
		"kubectl annotate sequentialinbox orders inbox.seqinbox.dev/approve-rollout=v2.0.0")
	if res.RequeueAfter != 0 {
		t.Errorf("requeue after %s; the approval annotation triggers the next pass", res.RequeueAfter)
	}
	if d := h.deployment("orders"); *d.Spec.Replicas != 2 {
		t.Fatalf("the consumers were stopped (replicas %d) before approval", *d.Spec.Replicas)
	}

	// Approving another version does not count.
	h.update("orders", func(in *v1alpha1.SequentialInbox) {
		metav1.SetMetaDataAnnotation(&in.ObjectMeta, v1alpha1.ApproveRolloutAnnotation, "v1.0.1")
	})
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.AwaitingApprovalReason)
	if d := h.deployment("orders"); *d.Spec.Replicas != 2 {
		t.Fatalf("an approval of v1.0.1 stopped the consumers for v2.0.0")
	}

	h.update("orders", func(in *v1alpha1.SequentialInbox) {
		metav1.SetMetaDataAnnotation(&in.ObjectMeta, v1alpha1.ApproveRolloutAnnotation, "v2.0.0")
	})
	h.reconcile("orders")
	if d := h.deployment("orders"); *d.Spec.Replicas != 0 {
		t.Fatalf("approved, but the old consumers still run (replicas %d)", *d.Spec.Replicas)
	}
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.CheckingRegistryReason)
}

func TestPodsOfAnUnknownVersionAreNotProvenCompatible(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	// Consumer pods exist without a Deployment of this operator (left over, or from an operator
	// that lost its state): their protocol is unknown.
	leftovers := h.startConsumerPods("orders", 1)
	h.reconcile("orders")
	probe := h.onlyJob("orders", componentProbe)
	if probe.Annotations[annotationConsumersStopped] != "false" {
		t.Errorf("probe taken next to running pods is marked consumers-stopped=%s", probe.Annotations[annotationConsumersStopped])
	}
	h.completeJob(probe)
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.WaitingForOldPodsReason, leftovers[0], "unknown engine version")
	h.noDeployment("orders")
}

func TestDeletionStopsTheConsumersAndWaitsForTheirPods(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	pods := h.startConsumerPods("orders", 2)

	h.must(k8s.Delete(h.ctx, h.get("orders")))
	h.reconcile("orders")
	if d := h.deployment("orders"); *d.Spec.Replicas != 0 {
		t.Fatalf("deleting the inbox left %d replicas running", *d.Spec.Replicas)
	}
	inbox := h.get("orders") // still there: the finalizer holds it
	if !controllerutil.ContainsFinalizer(inbox, finalizerName) {
		t.Fatal("the finalizer went while consumer pods still exist")
	}
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.DeletingReason, pods[0], pods[1])

	h.deletePods(pods...)
	h.reconcile("orders")
	err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "orders"}, &v1alpha1.SequentialInbox{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the inbox still exists after its pods are gone (err %v)", err)
	}
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "db"}, &corev1.Secret{}))
}

func TestUnchangedPassWritesNoStatus(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	before := h.get("orders")
	h.reconcile("orders")
	h.reconcile("orders")
	if after := h.get("orders"); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("resourceVersion %s → %s: a pass that changed nothing wrote the inbox", before.ResourceVersion, after.ResourceVersion)
	}
}

func TestStatusFromAStaleReadLosesTheOptimisticLock(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.reconcile("orders")
	stale := h.get("orders")

	// Another pass (or writer) updates the status in the meantime.
	h.completeJob(h.onlyJob("orders", componentProbe))
	h.reconcile("orders")
	fresh := h.get("orders")

	edited := stale.DeepCopy()
	edited.Status.TargetEngineVersion = "stale"
	res, err := h.r.patchStatus(h.ctx, stale, edited, ctrl.Result{}, nil)
	if !apierrors.IsConflict(err) || res.RequeueAfter != 0 {
		t.Fatalf("patchStatus from a stale read = %+v, %v; want the conflict, for the work queue to retry through its rate limiter", res, err)
	}
	if now := h.get("orders"); now.Status.TargetEngineVersion != fresh.Status.TargetEngineVersion || now.ResourceVersion != fresh.ResourceVersion {
		t.Errorf("the stale status overwrote the newer one (target %q)", now.Status.TargetEngineVersion)
	}
}

func jobNames(jobs []batchv1.Job) []string {
	names := make([]string, len(jobs))
	for i, j := range jobs {
		names[i] = j.Name
	}
	return names
}

func (h *harness) jobsOfImage(name, component, image string) []batchv1.Job {
	h.t.Helper()
	var out []batchv1.Job
	for _, j := range h.jobs(name, component) {
		if j.Spec.Template.Spec.Containers[0].Image == image {
			out = append(out, j)
		}
	}
	return out
}
