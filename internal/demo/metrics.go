package demo

import (
	"context"
	"fmt"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Counter is one number of the report's claim-engine table, read from a consumer's /metrics.
type Counter struct {
	// Label is what the report calls it.
	Label string
	// Metric is the Prometheus metric family; Labels select its series (all series when empty),
	// which are summed. A histogram contributes its sample count.
	Metric string
	Labels map[string]string
}

// engineCounters are the rows of the report's claim-engine table: what became of the records
// (internal/consumer), and the claim engine's and the sink client's own counters
// (docs/design.md#metrics).
func engineCounters() []Counter {
	outcome := func(label, o string) Counter {
		return Counter{Label: label, Metric: "seqinbox_records_total", Labels: map[string]string{"outcome": o}}
	}
	return []Counter{
		{Label: "records read", Metric: "seqinbox_records_total"},
		outcome("  delivered at once (claim won, condition held)", "Delivered"),
		outcome("  buffered (claim won, waiting for predecessors)", "Buffered"),
		outcome("  skipped as duplicates", "Duplicate"),
		outcome("  delivered without sequencing (filtered)", "Bypassed"),
		outcome("  dead-lettered", "DeadLettered"),
		{Label: "released from the buffer later", Metric: "seqinbox_message_waiting_seconds"},
		{Label: "claims won", Metric: "seqinbox_claims_total", Labels: map[string]string{"result": "Won"}},
		{Label: "claims lost (another delivery held the claim)", Metric: "seqinbox_claims_total", Labels: map[string]string{"result": "Lost"}},
		{Label: "sink calls accepted", Metric: "seqinbox_messages_consumed_total"},
		{Label: "sink attempts retried", Metric: "seqinbox_sink_retries_total"},
		{Label: "sink calls failed after all retries", Metric: "seqinbox_listener_failures_total"},
	}
}

// Scrape reads a /metrics endpoint in the Prometheus text format.
func Scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: HTTP %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return families, nil
}

// Value sums the counter's series in the scraped families; a missing family counts zero (a
// counter vector has no series until its first increment).
func (c Counter) Value(families map[string]*dto.MetricFamily) float64 {
	f, ok := families[c.Metric]
	if !ok {
		return 0
	}
	var sum float64
	for _, m := range f.GetMetric() {
		if !matches(m, c.Labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

func matches(m *dto.Metric, want map[string]string) bool {
	found := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			found++
		}
	}
	return found == len(want)
}
