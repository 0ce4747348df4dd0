//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// testConsumerStateInStatus runs after the stream was processed: the operator reads its consumer
// pods over the pod network, with the credentials it mounted into them, and status.consumers
// and kubectl get sqi show each pod's partitions and a lag of zero, as the committed offsets
// say, and the LAG and WAITING columns the consumers' own metrics. (Cases 4d and 8b show that the
// steady state starts no Job.)
func testConsumerStateInStatus(t *testing.T, s *suite) {
	pods := consumerPods(t)
	slices.Sort(pods)
	var sum *v1alpha1.ConsumersStatus
	testenv.WaitUntil(t, "status.consumers lists every consumer pod, read", 2*time.Minute, func() bool {
		out, err := kubectlErr(t.Context(), nil, "-n", namespace, "get", "sqi", inboxName, "-o", "jsonpath={.status.consumers}")
		if err != nil || out == "" {
			return false
		}
		sum = &v1alpha1.ConsumersStatus{}
		if err := json.Unmarshal([]byte(out), sum); err != nil {
			t.Fatalf("status.consumers %s: %v", out, err)
		}
		var read []string
		for _, p := range sum.Pods {
			if p.Unreachable == "" && p.Partitions != "" {
				read = append(read, p.Name)
			}
		}
		slices.Sort(read)
		return slices.Equal(read, pods) && sum.WaitingMessages != nil
	})
	if left, err := s.unprocessed(t.Context()); err != nil || left != 0 || sum.Lag != 0 {
		t.Errorf("status.consumers.lag %d; the committed offsets leave %d (%v)", sum.Lag, left, err)
	}
	for _, p := range sum.Pods {
		if !strings.Contains(p.Partitions, topic+"[") || !p.Ready || p.Blocked != nil {
			t.Errorf("status.consumers.pods: %+v, want a ready pod holding partitions of %s, nothing blocked", p, topic)
		}
	}
	// Quiet now: the columns equal the consumers' own metrics exactly.
	lag, waiting := consumerMetrics(t)
	if got := sqiColumns(t, "LAG", "WAITING"); got[0] != fmt.Sprint(lag) || got[1] != fmt.Sprint(waiting) {
		t.Errorf("kubectl get sqi shows LAG %s WAITING %s; the consumers' metrics say %d and %d", got[0], got[1], lag, waiting)
	}
	t.Logf("kubectl get sqi -o wide:\n%s", kubectl(t, "-n", namespace, "get", "sqi", inboxName, "-o", "wide"))
}

// e2eBlockedThreshold replaces the operator's five minutes in testBlockedRecordInDegraded.
const e2eBlockedThreshold = 20 * time.Second

// testBlockedRecordInDegraded makes the inbox's database refuse the first record of an order (SQLSTATE 53000, an
// infrastructure error the consumer retries) with the operator's threshold at 20s: Degraded
// PartitionBlocked appears no earlier than the threshold and within 30s of it, status.consumers
// names the record, and both clear within 30s of the database taking the record again.
func testBlockedRecordInDegraded(t *testing.T, s *suite) {
	restore := setOperatorArgs(t, "--blocked-threshold="+e2eBlockedThreshold.String())
	defer restore()
	pool := testenv.Pool(t, s.dbURL)
	order := s.newOrders(1)
	id := fmt.Sprintf("order-%d-OrderCreated", order)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `CREATE OR REPLACE FUNCTION e2e_out_of_resources() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'e2e: the database is out of resources' USING ERRCODE = '53000'; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TRIGGER e2e_out_of_resources BEFORE INSERT ON sequential_inbox_idempotence
FOR EACH ROW WHEN (NEW.idempotence_id = '`+id+`') EXECUTE FUNCTION e2e_out_of_resources()`); err != nil {
		t.Fatal(err)
	}
	lifted := false
	lift := func() {
		if !lifted {
			lifted = true
			if _, err := pool.Exec(context.Background(), `DROP TRIGGER IF EXISTS e2e_out_of_resources ON sequential_inbox_idempotence`); err != nil {
				t.Errorf("drop trigger: %v", err)
			}
		}
	}
	defer lift()

	// The order's other events wait in the buffer behind its refused OrderCreated.
	// OrderCreated on partition 0, the rest on the others: they are read and buffered while it
	// is retried.
	recs := orderRecords(order, 1, 1)
	for i, r := range recs {
		r.Partition = int32(1 + i%(partitions-1))
		if strings.HasSuffix(string(r.Headers[1].Value), "-OrderCreated") {
			r.Partition = 0
		}
	}
	produced := time.Now()
	produce(t, s.producer, recs)
	var degradedAt time.Time
	testenv.WaitUntil(t, "Degraded PartitionBlocked", e2eBlockedThreshold+30*time.Second, func() bool {
		if degradedReason(t) == v1alpha1.PartitionBlockedReason {
			degradedAt = time.Now()
			return true
		}
		return false
	})
	if after := degradedAt.Sub(produced); after < e2eBlockedThreshold {
		t.Errorf("Degraded PartitionBlocked %s after the record was produced, before the threshold %s", after, e2eBlockedThreshold)
	}
	t.Logf("Degraded PartitionBlocked %.1fs after the record was produced (threshold %s)", degradedAt.Sub(produced).Seconds(), e2eBlockedThreshold)
	testenv.WaitUntil(t, "status.consumers names the blocked record", 45*time.Second, func() bool {
		return strings.Contains(kubectl(t, "-n", namespace, "get", "sqi", inboxName, "-o", "jsonpath={.status.consumers.pods[*].blocked.error}"), "out of resources")
	})
	// The blocked record holds back its partition, its order's other events wait: kubectl get sqi
	// shows both as the consumers' metrics count them, within the band the operator writes by.
	var lag, waiting int64
	var columns []string
	testenv.WaitUntil(t, "kubectl get sqi shows the consumers' lag and waiting messages", 45*time.Second, func() bool {
		lag, waiting = consumerMetrics(t)
		columns = sqiColumns(t, "LAG", "WAITING")
		return lag > 0 && waiting > 0 && withinBand(columns[0], lag) && withinBand(columns[1], waiting)
	})
	t.Logf("blocked: kubectl get sqi shows LAG %s WAITING %s; the consumers' metrics %d and %d", columns[0], columns[1], lag, waiting)

	lift()
	liftedAt := time.Now()
	testenv.WaitUntil(t, "Degraded clears", 30*time.Second, func() bool { return degradedReason(t) == v1alpha1.AsExpectedReason })
	t.Logf("Degraded cleared %.1fs after the database took the record again", time.Since(liftedAt).Seconds())
	s.awaitProcessed(t, time.Minute)
}

// consumerMetricsPort is the port the operator gives the consumers' /metrics.
const consumerMetricsPort = 8080

// consumerMetrics sums the lag over every consumer pod's /metrics and the waiting messages the
// housekeeping leader counts there, read through the API server's pod proxy.
func consumerMetrics(t *testing.T) (lag, waiting int64) {
	t.Helper()
	for _, pod := range consumerPods(t) {
		raw := kubectl(t, "get", "--raw", fmt.Sprintf("/api/v1/namespaces/%s/pods/%s:%d/proxy/metrics", namespace, pod, consumerMetricsPort))
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(raw + "\n"))
		if err != nil {
			t.Fatalf("metrics of %s: %v", pod, err)
		}
		for _, m := range families["seqinbox_consumer_lag"].GetMetric() {
			lag += int64(m.GetGauge().GetValue())
		}
		for _, m := range families["seqinbox_messages_waiting"].GetMetric() {
			waiting += int64(m.GetGauge().GetValue())
		}
	}
	return lag, waiting
}

// sqiColumns returns columns of `kubectl get sqi` for the inbox, by their headers.
func sqiColumns(t *testing.T, headers ...string) []string {
	t.Helper()
	table := kubectl(t, "-n", namespace, "get", "sqi", inboxName)
	lines := strings.Split(table, "\n")
	header := strings.Fields(lines[0])
	var values []string
	for _, h := range headers {
		i := slices.Index(header, h)
		if i < 0 || len(lines) != 2 || len(strings.Fields(lines[1])) != len(header) {
			t.Fatalf("kubectl get sqi has no column %s:\n%s", h, table)
		}
		values = append(values, strings.Fields(lines[1])[i])
	}
	return values
}

// withinBand reports whether a column shows a count that the operator would not rewrite: equal
// to it or within the band the operator's status summary moves by (ten, or a tenth).
func withinBand(column string, count int64) bool {
	shown, err := strconv.ParseInt(column, 10, 64)
	if err != nil {
		return false
	}
	band := max(10, max(shown, count)/10)
	return (shown == 0) == (count == 0) && shown-count <= band && count-shown <= band
}

// degradedReason is the reason of the inbox's Degraded condition.
func degradedReason(t *testing.T) string {
	return kubectl(t, "-n", namespace, "get", "sqi", inboxName, "-o", `jsonpath={.status.conditions[?(@.type=="Degraded")].reason}`)
}

// setOperatorArgs adds arguments to the operator's container and waits for the new operator pod;
// the returned function puts the arguments back and waits again.
func setOperatorArgs(t *testing.T, extra ...string) (restore func()) {
	t.Helper()
	before := kubectl(t, "-n", operatorNamespace, "get", "deployment", operatorName, "-o", "jsonpath={.spec.template.spec.containers[0].args}")
	var args []string
	if err := json.Unmarshal([]byte(before), &args); err != nil {
		t.Fatalf("operator args %q: %v", before, err)
	}
	set := func(args []string) {
		value, _ := json.Marshal(args)
		kubectl(t, "-n", operatorNamespace, "patch", "deployment", operatorName, "--type=json",
			"-p", `[{"op":"replace","path":"/spec/template/spec/containers/0/args","value":`+string(value)+`}]`)
		kubectl(t, "-n", operatorNamespace, "rollout", "status", "deployment/"+operatorName, "--timeout=3m")
	}
	set(append(slices.Clone(args), extra...))
	return func() { set(args) }
}
