// Package controller reconciles SequentialInbox resources (docs/design.md#the-operator) and records
// the operator actions requested as SequentialInboxAction resources
// (docs/design.md#operator-actions). It never talks SQL itself: the database is reached only
// through `seqinbox migrate` and `seqinbox action` Jobs from the inbox's image, whose JSON reports
// it reads back from the Jobs' termination messages, and Kafka only through the GroupInspector
// interface.
//
// # One pass
//
// Reconcile (the outer reconcile) fetches the inbox, handles deletion and the finalizer, and runs
// the phases of reconcilePhases (the inner reconcile) in order. Each phase lets the pass go on,
// stops it to wait (for a watch event or a time), or fails it:
//
//  0. removeRetiredJobs: once per inbox and operator process, the Jobs of components that older
//     operators ran and this one does not (the registry checks, retired.go) are deleted.
//  1. validate: declaration.Compile (docs/design.md#the-declaration, the same function the consumer runs) and the
//     connection budget; an invalid spec stops here, before anything that runs is touched, with
//     ConfigValid=False naming every field. A poll interval that cannot cover the worst case of
//     one record is a warning (Degraded).
//  2. renderConfig: the inbox as the manifest `seqinbox consume -f` reads, in an immutable
//     ConfigMap named after its content hash; the hash also goes on the pod template.
//  3. probeTarget: what the target image speaks (see below).
//  4. gateRollout: the rollout gate (gate.go).
//  5. migrateSchema: `seqinbox migrate` from the target image, once per image and database.
//  6. ensureWorkload: the consumer Deployment, its PodDisruptionBudget and metrics Service, by
//     server-side apply of client-go apply configurations (only the fields the operator sets;
//     ForceOwnership).
//  7. watchGroup: members of another group protocol that keep the consumers out (Degraded).
//  8. reportConsumers: lists the running consumer pods for the poller, which reads each one's
//     state over HTTPS every StatePollInterval (no Job, no SQL) and asks for a pass only when
//     the status would change; a record a consumer has retried after infrastructure errors for
//     longer than BlockedThreshold is named in Degraded (PartitionBlocked), and status.consumers
//     summarises the rest (consumers.go).
//
// The status is written once, at the end of the pass (deferred), with an optimistic lock and
// only when it changed; observedGeneration is set only when every phase ran. Ready, Progressing
// and Degraded summarise the pass (status.go); transitions of the other conditions are Events.
//
// # Learning what an image speaks: the probe
//
// Before the operator migrates a database or starts consumers of an image, it must know the
// image's claim protocol without running the image's consumers. It runs a probe: a Job from the
// target image running `seqinbox migrate --dry-run --output json`, which applies nothing and
// reports the build's engine version and claim protocol, the schema version and the live
// consumers of the database's registry. An image is probed once (status.target*); an image that
// the Deployment already runs needs no probe (its pod template carries the engine annotations).
//
// # The rollout gate
//
// A rollout within one claim protocol is a rolling update, migrated first while the old consumers
// run (migrations within a protocol are additive by contract). Any other rollout — another
// protocol, or one that cannot be proven equal, such as consumer pods of an unknown version —
// runs as: approval (Supervised only) → stop the old consumers (scale to 0) → wait until their
// pods are gone, the Kafka consumer group has no members, and a probe created after the stop
// lists no live consumer of another protocol in the registry → migrate → start the new version.
// Each wait is a policy of a chain (cert-manager style); the first blocking one is the
// RolloutBlocked condition, naming what remains (pods, group members, registry entries).
//
// # Jobs
//
// Probes and migrations are attempts of a run tracked in status.probe and status.migration: each
// attempt is a new Job named <inbox>-<probe|migrate>-<key>-<attempt>, with no retries of its own
// (backoffLimit 0), applied without ForceOwnership (a Job of that name that someone else wrote is
// a conflict, never taken over) in the consumers' hardened pod (hardenedPod). A failed attempt is reported with the Job's reason and the container's
// message, and followed by the next attempt after an exponential backoff on the injected clock.
//
// # Operator actions
//
// A SequentialInboxAction (action_controller.go) is one request, immutable: the ActionReconciler
// runs one Job <inbox>-action-<hash of the action's UID>-1, owned by the action, from the inbox's
// image with the migration Job's pod and the database Secret; `seqinbox action` records the
// action as pending in the database (a consumer executes it) and writes an ActionReport to the
// termination message. The action's phase then becomes Recorded, or Failed with the report's
// error (e.g. the target does not exist) or the Job's failure; both are final, and a missing
// inbox is waited for. The Job is not retried: recording again what a consumer may already have
// executed is for a person to decide, with a new SequentialInboxAction.
package controller
