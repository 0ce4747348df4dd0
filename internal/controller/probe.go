package controller

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/manifest"
)

// The probe: before the operator migrates a database or starts consumers of an image, it must
// know what the image speaks. A probe is a Job from the target image running
// `seqinbox migrate --dry-run`: it applies nothing and reports the build's engine version and
// claim protocol, the schema version of the database and the live consumers in its registry.
//
// The operator probes an image once (its result stays in status.target*); an image the Deployment
// already runs needs no probe. The rollout gate asks for further probes of the same image to read
// the registry after the old consumers stopped: only a report whose Job was created while no
// consumer of the inbox ran (annotation inbox.seqinbox.dev/consumers-stopped) can prove that no
// old consumer is live.

// probeTarget learns the engine version and claim protocol of the target image.
func (r *Reconciler) probeTarget(ctx context.Context, s *scope) (phaseResult, error) {
	st := &s.inbox.Status
	switch {
	case s.running.known() && s.running.Image == s.image:
		s.target = s.running
	case st.TargetImage == s.image && st.TargetClaimProtocol != "":
		s.target = engine{Image: s.image, Version: st.TargetEngineVersion, ClaimProtocol: st.TargetClaimProtocol}
	default:
		out, err := r.runProbe(ctx, s)
		if err != nil {
			return proceed, err
		}
		switch out.state {
		case jobRunning:
			s.wait(v1alpha1.ProbingTargetImageReason, fmt.Sprintf("Job %s runs `seqinbox migrate --dry-run` from %s to learn its claim protocol.",
				st.Probe.JobName, s.image))
			return waitForEvent(), nil
		case jobBackingOff:
			s.wait(v1alpha1.ProbeFailedReason, probeFailure(st.Probe, out))
			return requeueAfter(out.retryIn), nil
		}
		s.target = engine{Image: s.image, Version: out.report.EngineVersion, ClaimProtocol: out.report.ClaimProtocol}
	}
	// The group protocol follows the spec's epoch, whatever the running consumers announce.
	s.target.GroupProtocol = manifest.GroupProtocol(s.target.ClaimProtocol, &s.inbox.Spec.Kafka)
	st.TargetImage, st.TargetEngineVersion, st.TargetClaimProtocol = s.target.Image, s.target.Version, s.target.ClaimProtocol
	return proceed, nil
}

// runProbe drives the current probe attempt for the target image and the spec's generation. A
// failed probe is also a problem for the Degraded condition.
func (r *Reconciler) runProbe(ctx context.Context, s *scope) (jobOutcome, error) {
	run := currentRun(&s.inbox.Status.Probe, hashOf(s.image, strconv.FormatInt(s.inbox.Generation, 10)))
	out, err := r.runJob(ctx, s, jobRequest{
		component:   componentProbe,
		run:         run,
		args:        reportArgs("--dry-run"),
		annotations: map[string]string{annotationConsumersStopped: strconv.FormatBool(s.consumersStopped())},
	})
	if err != nil {
		return out, fmt.Errorf("probe %s: %w", s.image, err)
	}
	if out.state == jobBackingOff && run.Failures > 0 {
		s.problem(v1alpha1.ProbeFailedReason, probeFailure(run, out))
	}
	if out.state == jobSucceeded {
		if err := r.deleteSupersededJobs(ctx, s, componentProbe, run.JobName); err != nil {
			return out, err
		}
	}
	return out, nil
}

func probeFailure(run *v1alpha1.JobRunStatus, out jobOutcome) string {
	return fmt.Sprintf("The probe of the target image failed %d time(s), last: %s. Attempt %d starts in %s.",
		run.Failures, run.LastFailure, run.Attempt, out.retryIn.Round(time.Second))
}

// stoppedWhenCreated reports whether a probe Job was created while no consumer of the inbox ran.
func stoppedWhenCreated(out jobOutcome) bool {
	return out.job != nil && out.job.Annotations[annotationConsumersStopped] == "true"
}
