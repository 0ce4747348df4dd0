package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
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
	out, err := r.runJob(ctx, s, jobRequest{component: componentMigration, run: run, args: reportArgs()})
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
		message := fmt.Sprintf("The schema migration failed %d time(s), last: %s. Attempt %d starts in %s.",
			run.Failures, run.LastFailure, run.Attempt, out.retryIn.Round(time.Second))
		s.setCondition(schemaReadyCondition(metav1.ConditionFalse, v1alpha1.MigrationFailedReason, message))
		s.problem(v1alpha1.MigrationFailedReason, message)
		s.wait(v1alpha1.MigrationFailedReason, message)
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
