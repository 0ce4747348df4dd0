// Package monitoring tests the optional monitoring bundle (config/prometheus) against the code:
// every alert and dashboard expression must name only metrics that a registry of the code serves.
package monitoring

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/internal/consumer"
	// The operator's metrics register with controller-runtime's registry when it is linked in.
	_ "github.com/seqinbox/seqinbox/internal/controller"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/internal/version"
)

const inboxYAML = `
apiVersion: inbox.seqinbox.dev/v1alpha1
kind: SequentialInbox
metadata: {name: orders, namespace: shop}
spec:
  kafka: {bootstrapServers: ["127.0.0.1:9092"], topics: [orders], consumerGroup: orders}
  database: {urlSecretRef: {name: db, key: url}}
  sink: {url: "http://127.0.0.1:8080/events"}
  sequences:
  - name: order
    retention: 1h
    messages: [{type: OrderCreated}]
`

// exported returns the names of every metric the consumer's registry and the operator's
// registry (controller-runtime's, with the operator's own metrics and build info) describe.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	inbox, err := manifest.Parse([]byte(inboxYAML))
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{Inbox: inbox, DatabaseURL: "postgres://unused@127.0.0.1:1/x", InstanceID: "rules-test"})
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}
	operator := prometheus.NewRegistry()
	operator.MustRegister(version.BuildInfo("v0", "p"))
	names := map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, r := range []prometheus.Collector{c.Registry(), ctrlmetrics.Registry.(*prometheus.Registry), operator} {
		ch := make(chan *prometheus.Desc)
		go func() { r.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	return names
}

// metricNames are the seqinbox metric names an expression refers to; the series suffixes of a
// histogram (_bucket, _sum, _count) name the histogram.
func metricNames(expr string, exported map[string]bool) []string {
	var names []string
	for _, name := range regexp.MustCompile(`\bseqinbox_[a-z_]+\b`).FindAllString(expr, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
				name = base
			}
		}
		names = append(names, name)
	}
	return names
}

// ruleExpressions reads the alert expressions of the PrometheusRule.
func ruleExpressions(t *testing.T, root string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	out := map[string]string{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
		}
	}
	return out
}

// dashboardExpressions reads the panel queries and template variable queries of the dashboard.
func dashboardExpressions(t *testing.T, root string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "seqinbox-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("seqinbox-dashboard.json: %v", err)
	}
	out := map[string]string{}
	for _, p := range dash.Panels {
		for i, target := range p.Targets {
			out["panel "+p.Title+" #"+string(rune('A'+i))] = target.Expr
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok && v.Type == "query" {
			out["variable "+v.Name] = q
		}
	}
	return out
}

func TestRulesAndDashboardReferOnlyToExportedMetrics(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	names := exported(t)
	for _, want := range []string{"seqinbox_records_total", "seqinbox_consumer_lag", "seqinbox_build_info", "seqinbox_inbox_condition", "seqinbox_oldest_waiting_message_age_seconds"} {
		if !names[want] {
			t.Fatalf("the registries do not describe %s; the check below would prove nothing", want)
		}
	}
	rules, dashboard := ruleExpressions(t, root), dashboardExpressions(t, root)
	if len(rules) < 5 || len(dashboard) < 10 {
		t.Fatalf("read %d alerts and %d dashboard queries; the bundle lost its content", len(rules), len(dashboard))
	}
	var used []string
	for _, exprs := range []map[string]string{rules, dashboard} {
		for where, expr := range exprs {
			found := metricNames(expr, names)
			if len(found) == 0 {
				t.Errorf("%s names no seqinbox metric: %q", where, expr)
			}
			for _, name := range found {
				if !names[name] {
					t.Errorf("%s refers to %s, which no registry of the code serves", where, name)
				}
				used = append(used, name)
			}
		}
	}
	for _, alerted := range []string{"seqinbox_consumer_lag", "seqinbox_dead_letters_total", "seqinbox_oldest_waiting_message_age_seconds", "seqinbox_inbox_condition"} {
		if !slices.Contains(used, alerted) {
			t.Errorf("no alert or panel watches %s", alerted)
		}
	}
}

func TestMetricNamesMapHistogramSeriesToTheirHistogram(t *testing.T) {
	exported := map[string]bool{"seqinbox_message_waiting_seconds": true, "seqinbox_records_total": true}
	got := metricNames(`rate(seqinbox_message_waiting_seconds_bucket{le="1"}[5m]) / seqinbox_records_total + seqinbox_unknown_count`, exported)
	want := []string{"seqinbox_message_waiting_seconds", "seqinbox_records_total", "seqinbox_unknown_count"}
	if !slices.Equal(got, want) {
		t.Errorf("metricNames = %v, want %v", got, want)
	}
}
