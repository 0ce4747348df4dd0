package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/migrations"
)

// migrateSchema brings the database to the target image's schema with a Job running
// `seqinbox migrate` from that image, once per image and database (the URL Secret's reference
// and resourceVersion: a changed Secret may name another database). Migrations within one claim
// protocol are additive, so a compatible rollout migrates while the old consumers run; an
// incompatible one reaches this phase only after the gate saw the old consumers gone. A failed
// Job is followed by a new one after an exponential backoff; status.migration counts attempts.
func (r *Reconciler) migrateSchema(ctx context.Context, s *scope) (phaseResult, error) {
	st := &s.inbox.Status
	database, found, err := r.databaseIdentity(ctx, s)
	if err != nil {
		return proceed, err
	}
	if !found {
		ref := s.inbox.Spec.Database.URLSecretRef
		message := fmt.Sprintf("Secret %s (spec.database.urlSecretRef) does not exist; the schema cannot be migrated.", ref.Name)
		s.setCondition(schemaReadyCondition(metav1.ConditionFalse, v1alpha1.DatabaseSecretMissingReason, message))
		s.problem(v1alpha1.DatabaseSecretMissingReason, message)
		s.wait(v1alpha1.DatabaseSecretMissingReason, message)
		return requeueAfter(r.PollInterval), nil
	}
	run := currentRun(&st.Migration, hashOf(s.image, database))
	if run.Succeeded {
		return proceed, nil
	}
	out, err := r.runJob(ctx, s, jobRequest{component: componentMigration, run: run, args: reportArgs(),
		env: tablesEnv(s.inbox)})
	if err != nil {
		return proceed, fmt.Errorf("migrate schema: %w", err)
	}
	switch out.state {
	case jobRunning:
		message := fmt.Sprintf("Job %s migrates the schema with %s (attempt %d).", run.JobName, s.image, run.Attempt)
		s.setCondition(schemaReadyCondition(metav1.ConditionFalse, v1alpha1.MigrationRunningReason, message))
		s.wait(v1alpha1.MigrationRunningReason, message)
		return waitForEvent(), nil
	case jobBackingOff:
		if owner := otherOwner(s.inbox, out.report); owner != "" {
			run.LastFailureReason, run.LastFailure = v1alpha1.DatabaseInUseReason, truncate(databaseInUse(s.inbox, owner))
		}
		reason := v1alpha1.MigrationFailedReason
		message := fmt.Sprintf("The schema migration failed %d time(s), last: %s. Attempt %d starts in %s.",
			run.Failures, run.LastFailure, run.Attempt, out.retryIn.Round(time.Second))
		if run.LastFailureReason == v1alpha1.DatabaseInUseReason {
			reason = v1alpha1.DatabaseInUseReason
			message = fmt.Sprintf("%s The operator checks again in %s.", run.LastFailure, out.retryIn.Round(time.Second))
		}
		s.setCondition(schemaReadyCondition(metav1.ConditionFalse, reason, message))
		s.problem(reason, message)
		s.wait(reason, message)
		return requeueAfter(out.retryIn), nil
	}
	st.SchemaVersion = int32(out.report.SchemaVersion)
	s.setCondition(schemaReadyCondition(metav1.ConditionTrue, v1alpha1.MigratedReason, fmt.Sprintf(
		"Schema version %d (applied now: %v) by Job %s from %s.", out.report.SchemaVersion, out.report.Applied, run.JobName, s.image)))
	if err := r.deleteSupersededJobs(ctx, s, componentMigration, run.JobName); err != nil {
		return proceed, err
	}
	return proceed, nil
}

// inboxEnv names the inbox a migration runs for (`seqinbox migrate --inbox`). An environment
// variable rather than the flag, so that an image of a release without owner checks ignores it
// instead of failing on an unknown flag.
const inboxEnv = "SEQINBOX_INBOX"

// schemaEnv is spec.database.schema, the schema that must hold the tables (`seqinbox migrate
// --schema`, `seqinbox action --schema`); an environment variable for the same reason.
const schemaEnv = "SEQINBOX_DATABASE_SCHEMA"

// tablesEnv tells a Job which inbox's tables it works on (inboxEnv) and, when the inbox names
// one, in which schema they must be (schemaEnv).
func tablesEnv(inbox *v1alpha1.SequentialInbox) []*corev1ac.EnvVarApplyConfiguration {
	env := []*corev1ac.EnvVarApplyConfiguration{corev1ac.EnvVar().WithName(inboxEnv).WithValue(manifest.InboxName(inbox))}
	if schema := inbox.Spec.Database.Schema; schema != "" {
		env = append(env, corev1ac.EnvVar().WithName(schemaEnv).WithValue(schema))
	}
	return env
}

// otherOwner is the inbox that owns the database's tables according to a failed migration's
// report, when that is not this inbox; empty otherwise.
func otherOwner(inbox *v1alpha1.SequentialInbox, report *migrations.Report) string {
	if report == nil || report.Owner == "" || report.Owner == manifest.InboxName(inbox) {
		return ""
	}
	return report.Owner
}

// databaseInUse explains a refusal by the owner of the tables and what to do.
func databaseInUse(inbox *v1alpha1.SequentialInbox, owner string) string {
	return fmt.Sprintf("The database's tables belong to SequentialInbox %[1]s: one set of tables serves one inbox, because "+
		"housekeeping and operator actions act on every row they see. Nothing runs for this inbox, and %[1]s is left as it is. "+
		"Point spec.database.urlSecretRef at a database of its own, or give it a schema of its own (spec.database.schema, with the search_path of its database role set to it); "+
		"if %[1]s is gone for good and this inbox takes over its tables, run "+
		"`seqinbox migrate --inbox %[2]s --take-over-from %[1]s` against the database.", owner, manifest.InboxName(inbox))
}

// databaseIdentity names the database the spec points at by the URL Secret's reference and
// resourceVersion, read as metadata only (the operator never reads the URL itself).
func (r *Reconciler) databaseIdentity(ctx context.Context, s *scope) (identity string, found bool, err error) {
	ref := s.inbox.Spec.Database.URLSecretRef
	var secret metav1.PartialObjectMetadata
	secret.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	err = r.APIReader.Get(ctx, client.ObjectKey{Namespace: s.inbox.Namespace, Name: ref.Name}, &secret)
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read metadata of secret %s: %w", ref.Name, err)
	}
	return ref.Name + "/" + ref.Key + "@" + secret.ResourceVersion, true, nil
}
