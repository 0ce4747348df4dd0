package consumer

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// dataLabels carry data (declared types, topics, group members, versions), not a value of
// seqinbox's own vocabulary; their values are as the data spells them.
var dataLabels = map[string]bool{
	"sequence": true, "type": true, "topic": true, "partition": true, "group": true, "member_id": true,
	"client_id": true, "host": true, "protocol": true, "namespace": true, "inbox": true,
	"version": true, "commit": true, "claim_protocol": true, "le": true, "quantile": true,
}

// camelCase is the one casing of label values that name an outcome, result, reason, cause or
// action; httpClass the HTTP status classes (2xx, 5xx) as HTTP writes them.
var (
	camelCase = regexp.MustCompile(`^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*$`)
	httpClass = regexp.MustCompile(`^[1-5]xx$`)
)

// labelCasing returns how many label values of seqinbox metrics it checked per metric and label
// ("metric/label"), and every value that is neither data nor CamelCase.
func labelCasing(families []*dto.MetricFamily) (checked map[string]int, wrong []string) {
	checked = map[string]int{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "seqinbox_") {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if dataLabels[l.GetName()] {
					continue
				}
				checked[f.GetName()+"/"+l.GetName()]++
				if v := l.GetValue(); !camelCase.MatchString(v) && !httpClass.MatchString(v) {
					wrong = append(wrong, fmt.Sprintf("%s{%s=%q}", f.GetName(), l.GetName(), v))
				}
			}
		}
	}
	return checked, wrong
}

// TestEveryMetricLabelValueIsCamelCase runs a consumer through most outcomes (buffered and
// released, delivered, duplicate, dead-lettered for an undeclared type, for a payload that is not
// JSON and for a sink failure) and gathers its registry: every label value that names an outcome,
// result, reason, cause or action is CamelCase, one casing for alerts and dashboards.
func TestEveryMetricLabelValueIsCamelCase(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	s := newSink(t, func(id string, _ int) int {
		if id == "lc-fail" {
			return 500
		}
		return 200
	})
	r := startConsumer(t, testInbox(t, seeds, "g-label-case", s.srv.URL, sinkOpts{}), "label-case-1")
	notJSON := event(0, "OrderCreated", "lc-json", "lc-o3")
	notJSON.Value = []byte("not json")
	testenv.Produce(t, seeds,
		event(0, "OrderPaid", "lc-paid", "lc-o1"),
		event(0, "OrderCreated", "lc-created", "lc-o1"),
		event(0, "OrderCreated", "lc-created", "lc-o1"),
		event(0, "OrderCancelled", "lc-undeclared", "lc-o2"),
		notJSON,
		event(0, "OrderCreated", "lc-fail", "lc-o4"),
	)
	waitUntil(t, "every record was processed", func() bool { return r.events.count("") == 6 })
	families, err := r.c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	checked, wrong := labelCasing(families)
	for _, w := range wrong {
		t.Errorf("%s: label values are CamelCase", w)
	}
	for _, want := range []string{
		"seqinbox_records_total/outcome", "seqinbox_record_retries_total/cause", "seqinbox_claims_total/result",
		"seqinbox_release_transactions_total/result", "seqinbox_housekeeping_deleted_instances_total/reason",
		"seqinbox_actions_total/action", "seqinbox_dead_letters_total/reason", "seqinbox_sink_failures_total/reason",
		"seqinbox_sink_request_duration_seconds/code",
	} {
		if checked[want] == 0 {
			t.Errorf("no value of %s was gathered; the check proves nothing for it", want)
		}
	}
}

func TestLabelCasingRefusesOtherCasings(t *testing.T) {
	for value, ok := range map[string]bool{
		"Delivered": true, "DeadLettered": true, "ConsumeAll": true, "5xx": true,
		"won": false, "dead-letter": false, "CONSUME_ALL": false, "transport": false, "Dead_Letter": false, "": false,
	} {
		name, label := "seqinbox_test_total", "result"
		family := &dto.MetricFamily{Name: &name, Metric: []*dto.Metric{{Label: []*dto.LabelPair{{Name: &label, Value: &value}}}}}
		if _, wrong := labelCasing([]*dto.MetricFamily{family}); (len(wrong) == 0) != ok {
			t.Errorf("label value %q accepted %v, want %v", value, len(wrong) == 0, ok)
		}
	}
}
