package controller

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/internal/testenv/clustersim"
	"github.com/seqinbox/seqinbox/migrations"
)

// migrateForReal plays the kubelet for a migration Job, running what `seqinbox migrate` runs
// against a real database: the migrations for the inbox the Job names (SEQINBOX_INBOX), then the
// Job completes or fails with the report in its termination message.
func (h *harness) migrateForReal(job *batchv1.Job, dbURL string) {
	h.t.Helper()
	var inbox string
	for _, e := range job.Spec.Template.Spec.Containers[0].Env {
		if e.Name == inboxEnv {
			inbox = e.Value
		}
	}
	if inbox == "" {
		h.t.Fatalf("migration Job %s does not name its inbox in %s", job.Name, inboxEnv)
	}
	conn, err := pgx.Connect(h.ctx, dbURL)
	h.must(err)
	defer func() { _ = conn.Close(h.ctx) }()
	report := reportOf(job)
	res, err := migrations.ApplyFor(h.ctx, conn, inbox, "")
	report.SchemaVersion, report.Applied = res.After, res.Applied
	var owned *migrations.OwnedError
	if errors.As(err, &owned) {
		report.Owner, report.Error = owned.Owner, err.Error()
		message, merr := json.Marshal(report)
		h.must(merr)
		h.must(clustersim.FailJob(h.ctx, k8s, job, string(message)))
		return
	}
	h.must(err)
	report.Owner, _, _, err = migrations.Owner(h.ctx, conn)
	h.must(err)
	h.must(clustersim.CompleteJob(h.ctx, k8s, job, report))
}

// TestASecondInboxOnTheSameTablesIsRefusedWhileTheFirstRuns: two inboxes whose URL Secret names
// one database. The first migrates it and becomes the owner of its tables; the second's
// migration is refused, and the second inbox says so (SchemaReady=False, DatabaseInUse, naming
// the owner and what to do) and starts nothing, while the first stays Ready.
func TestASecondInboxOnTheSameTablesIsRefusedWhileTheFirstRuns(t *testing.T) {
	h := newHarness(t)
	dbURL := testenv.FreshDatabase(t, "controller_owner")

	h.create("orders", nil)
	h.reconcile("orders")
	h.completeJob(h.onlyJob("orders", componentProbe))
	h.reconcile("orders")
	h.migrateForReal(h.onlyJob("orders", componentMigration), dbURL)
	h.reconcile("orders")
	h.rollOut("orders")
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason)

	h.create("invoices", nil) // the same Secret "db": the same database
	h.reconcile("invoices")
	h.completeJob(h.onlyJob("invoices", componentProbe))
	h.reconcile("invoices")
	h.migrateForReal(h.onlyJob("invoices", componentMigration), dbURL)
	h.reconcile("invoices")

	owner, invoices := h.ns+"/orders", h.ns+"/invoices"
	h.expectCondition("invoices", v1alpha1.ConditionSchemaReady, metav1.ConditionFalse, v1alpha1.DatabaseInUseReason,
		"belong to SequentialInbox "+owner, "spec.database.urlSecretRef", "search_path",
		"seqinbox migrate --inbox "+invoices+" --take-over-from "+owner)
	h.expectCondition("invoices", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.DatabaseInUseReason)
	h.expectCondition("invoices", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.DatabaseInUseReason)
	h.noDeployment("invoices")
	if notes := h.events("invoices", v1alpha1.DatabaseInUseReason); len(notes) == 0 {
		t.Error("no Event reported DatabaseInUse")
	}

	// A pass during the backoff (any watch event) keeps the verdict.
	h.reconcile("invoices")
	h.expectCondition("invoices", v1alpha1.ConditionSchemaReady, metav1.ConditionFalse, v1alpha1.DatabaseInUseReason, owner)
	h.noDeployment("invoices")

	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason)
	h.expectCondition("orders", v1alpha1.ConditionSchemaReady, metav1.ConditionTrue, v1alpha1.MigratedReason)

	// After the backoff the operator checks again with a new Job; still refused, still said so.
	h.clock.Step(testRetryMax)
	h.reconcile("invoices")
	h.migrateForReal(h.onlyJob("invoices", componentMigration), dbURL)
	h.reconcile("invoices")
	h.expectCondition("invoices", v1alpha1.ConditionSchemaReady, metav1.ConditionFalse, v1alpha1.DatabaseInUseReason, owner)
	h.noDeployment("invoices")
}

// TestTheMigrationJobNamesTheSchemaOfTheInbox: an inbox with spec.database.schema passes it to
// its migration Job (SEQINBOX_DATABASE_SCHEMA), whose `seqinbox migrate` refuses to create the
// tables anywhere else; an inbox without one passes nothing, so that the check stays off.
func TestTheMigrationJobNamesTheSchemaOfTheInbox(t *testing.T) {
	h := newHarness(t)
	h.create("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Database.Schema = "orders_inbox" })
	h.create("invoices", nil)
	for name, want := range map[string]string{"orders": "orders_inbox", "invoices": ""} {
		h.reconcile(name)
		h.completeJob(h.onlyJob(name, componentProbe))
		h.reconcile(name)
		got := ""
		for _, e := range h.onlyJob(name, componentMigration).Spec.Template.Spec.Containers[0].Env {
			if e.Name == schemaEnv {
				got = e.Value
			}
		}
		if got != want {
			t.Errorf("%s: migration Job's %s = %q, want %q", name, schemaEnv, got, want)
		}
	}
}
