package controller

import (
	"context"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/sink"
)

// validate runs the semantic validation that the CRD schema cannot express: the rules of the
// sequences (docs/design.md#the-declaration; declaration.Compile, the same function the consumer
// builds its engine with), the headers the sink may forward (sink.CheckForwardHeaders, the list
// the consumer's sink accepts) and the connection budget. An invalid spec stops the pass before
// anything running is touched, and ConfigValid names every offending field. A poll interval that
// cannot cover the worst case is a warning (Degraded), not an error.
func (r *Reconciler) validate(_ context.Context, s *scope) (phaseResult, error) {
	set, errs := declaration.Compile(&s.inbox.Spec)
	errs = append(errs, sink.CheckForwardHeaders(sink.ForwardHeadersPath, s.inbox.Spec.Sink.ForwardHeaders)...)
	if err := checkConnectionBudget(&s.inbox.Spec); err != nil {
		errs = append(errs, err)
	}
	s.setCondition(configValidCondition(errs))
	if len(errs) > 0 {
		return waitForEvent(), nil
	}
	s.set = set
	if warning := checkPollInterval(&s.inbox.Spec, declaration.LongestChain(set)); warning != nil {
		s.problem(v1alpha1.MaxPollIntervalTooShortReason, warning.Error())
	}
	return proceed, nil
}
