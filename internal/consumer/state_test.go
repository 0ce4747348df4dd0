package consumer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/seqinbox/seqinbox/internal/consumerstate"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// stateCredentials writes new consumer state credentials where a consumer pod mounts them and
// returns their Secret data, as the operator holds it.
func stateCredentials(t *testing.T) (dir string, secret map[string][]byte) {
	t.Helper()
	secret, err := consumerstate.NewCredentials(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	for k, v := range secret {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	return dir, secret
}

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// TestStateServesPartitionsLagBlockedRecordAndDatabaseCountsToTheOperatorOnly runs a consumer
// with a record the database refuses, a message waiting for its predecessor and a dead letter,
// and reads its state as the operator does: the state names each, agrees with /metrics, and is
// refused to a request without the token, with another token, over plain HTTP, and to a client
// that trusts another inbox's certificate.
func TestStateServesPartitionsLagBlockedRecordAndDatabaseCountsToTheOperatorOnly(t *testing.T) {
	pool := database(t)
	seeds := cluster(t, 2)
	s := newSink(t, nil)
	lift := outOfResources(t, pool, "st-stuck")
	dir, secret := stateCredentials(t)
	addr := freeAddr(t)
	r := startConsumer(t, testInbox(t, seeds, "g-state", s.srv.URL, sinkOpts{}), "state-1", func(c *Config) {
		c.StateAddr, c.StateCredentialsDir = addr, dir
	})
	notJSON := event(1, "OrderCreated", "st-bad", "")
	notJSON.Value = []byte("not json")
	testenv.Produce(t, seeds,
		event(0, "OrderCreated", "st-stuck", "st-o1"),
		event(1, "OrderPaid", "st-paid", "st-o2"), // waits for OrderCreated of st-o2
		notJSON)

	operator, err := consumerstate.NewClient(secret, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer operator.Close()
	var st consumerstate.State
	waitUntil(t, "the state names the blocked record, the waiting message and the dead letter", func() bool {
		if st, err = operator.Get(t.Context(), addr); err != nil {
			t.Logf("read state: %v", err)
			return false
		}
		return st.Blocked != nil && st.Database != nil && st.Database.Waiting() == 1 && st.DeadLettersLastHour == 1
	})
	if b := st.Blocked; b.Topic != "orders" || b.Partition != 0 || b.Offset != 0 || !strings.Contains(b.Error, "out of resources") || b.Since.IsZero() {
		t.Errorf("blocked record %+v, want orders[0] offset 0 with the database's error", b)
	}
	if st.Instance != "state-1" || st.EngineVersion != r.c.build.engineVersion || st.ClaimProtocol != r.c.build.claimProtocol || !st.Ready {
		t.Errorf("state %+v, want instance state-1, ready, of this build", st)
	}
	if got := st.Database.WaitingByType["OrderPaid"]; got != 1 {
		t.Errorf("waiting by type %v, want OrderPaid: 1", st.Database.WaitingByType)
	}
	if got := st.DeadLettersLastHourByReason; len(got) != 1 || got["InvalidJSON"] != 1 {
		t.Errorf("dead letters of the last hour by reason %v, want InvalidJSON: 1", got)
	}
	if got := st.Database.OldestWaitingSecondsByType; len(got) != 1 || got["OrderPaid"] <= 0 || got["OrderPaid"] > st.Database.OldestWaitingSeconds {
		t.Errorf("oldest waiting age by type %v, want the OrderPaid's age, at most the oldest's %v", got, st.Database.OldestWaitingSeconds)
	}
	if st.Database.OldestWaitingSeconds <= 0 {
		t.Errorf("oldest waiting age %v, want the OrderPaid's age", st.Database.OldestWaitingSeconds)
	}
	if strings.Contains(st.Blocked.Error, `"orderId"`) {
		t.Errorf("the blocked record's error carries its payload: %s", st.Blocked.Error)
	}
	// What the state says is what /metrics says. Lag moves while records finish and offsets are
	// committed, so the two are read again until the same moment shows in both.
	var (
		metricLag map[string]float64
		differ    []string
	)
	waitUntil(t, "the state's lag is the lag of /metrics", func() bool {
		if st, err = operator.Get(t.Context(), addr); err != nil {
			t.Logf("read state: %v", err)
			return false
		}
		metricLag, differ = lagSeries(t, r), nil
		if len(st.Partitions) != 2 || len(metricLag) != 2 {
			differ = append(differ, fmt.Sprintf("state partitions %+v, lag series %v; want both partitions", st.Partitions, metricLag))
		}
		for _, p := range st.Partitions {
			if want := metricLag[strconv.Itoa(int(p.Partition))]; float64(p.Lag) != want || p.Topic != "orders" {
				differ = append(differ, fmt.Sprintf("state lag of %s[%d] = %d, seqinbox_consumer_lag = %v", p.Topic, p.Partition, p.Lag, want))
			}
		}
		if len(differ) > 0 {
			t.Log(strings.Join(differ, "; "))
		}
		return len(differ) == 0
	})
	if got := gauge(t, r.c, "seqinbox_messages_waiting", "type", "OrderPaid"); got != float64(st.Database.Waiting()) {
		t.Errorf("seqinbox_messages_waiting = %v, state says %d", got, st.Database.Waiting())
	}

	// Nobody but the holder of the inbox's credentials reads it.
	for name, header := range map[string]string{"no token": "", "another token": "Bearer " + strings.Repeat("0", 64), "basic auth": "Basic b3BlcmF0b3I6eA=="} {
		if status := rawStatus(t, secret, addr, header); status != http.StatusUnauthorized {
			t.Errorf("%s: HTTP %d, want 401", name, status)
		}
	}
	_, other := stateCredentials(t)
	stranger, err := consumerstate.NewClient(other, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	if _, err := stranger.Get(t.Context(), addr); !errors.Is(err, consumerstate.ErrCredentials) {
		t.Errorf("a client of another inbox's credentials: %v, want ErrCredentials", err)
	}
	if resp, err := http.Get("http://" + addr + consumerstate.Path); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP answered 200")
		}
	}

	lift()
	waitUntil(t, "the state names no blocked record once the database recovered", func() bool {
		st, err = operator.Get(t.Context(), addr)
		return err == nil && st.Blocked == nil
	})
}

// rawStatus requests the state over TLS that trusts the inbox's certificate, with the given
// Authorization header, and returns the HTTP status.
func rawStatus(t *testing.T, secret map[string][]byte, addr, authorization string) int {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(secret[consumerstate.CertKey])
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: consumerstate.ServerName}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+addr+consumerstate.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func TestDeadLettersOfTheLastHourCountFromTheNewestSampleAnHourOld(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := newHourlyCount(clk)
	steps := []struct {
		after time.Duration
		total float64
		want  int64
	}{
		{0, 0, 0},
		{10 * time.Minute, 3, 3},  // within the first hour: everything since the start
		{40 * time.Minute, 5, 5},  // 50m
		{15 * time.Minute, 6, 6},  // 65m: the newest sample an hour old is the start's (0)
		{30 * time.Minute, 6, 3},  // 95m: the base is the sample at 10m (3)
		{3 * time.Hour, 9, 3},     // 4h35m: the base is the sample at 95m (6)
		{30 * time.Second, 10, 4}, // no new sample within the minute; the base stands
		{30 * time.Second, 10, 4}, // a minute after the last sample: a new one, the base stands
	}
	for i, s := range steps {
		clk.Step(s.after)
		if got := h.lastHour(s.total); got != s.want {
			t.Fatalf("step %d (total %v): %d dead letters in the last hour, want %d", i, s.total, got, s.want)
		}
	}
}
