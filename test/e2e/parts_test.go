//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The parts outside the cluster run in the test process on the node's address, where pods reach
// them; each gets a selectorless Service with an EndpointSlice, so that the inbox names them the
// way it would name a managed service. They live as long as the whole suite: cleanup is the
// suite's, not the case's.

// startBroker starts a Kafka broker (kfake, the real wire protocol) on the node's address: it
// advertises that address, so pods and this process reach it alike.
func startBroker(t *testing.T, cleanup func(func()), topics map[string]int32) string {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.ListenFn(func(network, addr string) (net.Listener, error) {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		return net.Listen(network, net.JoinHostPort(env.nodeIP, port))
	})}
	for name, partitions := range topics {
		opts = append(opts, kfake.SeedTopics(partitions, name))
	}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start the broker: %v", err)
	}
	cleanup(cluster.Close)
	return cluster.ListenAddrs()[0]
}

// forward accepts connections on the node's address and forwards each to target: PostgreSQL
// listens on loopback only, and the forwarded connections reach it from 127.0.0.1.
func forward(t *testing.T, cleanup func(func()), target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(env.nodeIP, "0"))
	if err != nil {
		t.Fatalf("forwarder: %v", err)
	}
	var wg sync.WaitGroup
	conns := map[net.Conn]bool{}
	var mu sync.Mutex
	cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				track(c, true)
				track(u, true)
				defer track(c, false)
				defer track(u, false)
				done := make(chan struct{})
				go func() {
					_, _ = io.Copy(u, c)
					// The client is gone (a killed pod): close the server side, so that
					// PostgreSQL ends the session and rolls its transaction back.
					u.Close()
					close(done)
				}()
				_, _ = io.Copy(c, u)
				c.Close()
				<-done
			})
		}
	})
	return ln.Addr().String()
}

// delivery is one request the sink answered.
type delivery struct {
	Type, ID, Subtype, ContextID string
	// From is the client's IP address: the consumer pod that delivered.
	From string
	At   time.Time
	// Accepted is false when the request ended before the sink answered (its client went away).
	Accepted bool
}

// sink is the recording sink: it accepts every CloudEvent and keeps the log of what it
// accepted, in arrival order. hold makes it keep the first request for one ce-id open until
// its client goes away.
type sink struct {
	mu   sync.Mutex
	log  []delivery
	hold map[string]chan struct{}
	// delays make the sink take a while for IDs with a prefix, as a real service does.
	delays map[string]time.Duration
	addr   string
}

func startSink(t *testing.T, cleanup func(func())) *sink {
	t.Helper()
	s := &sink{hold: map[string]chan struct{}{}, delays: map[string]time.Duration{}}
	ln, err := net.Listen("tcp", net.JoinHostPort(env.nodeIP, "0"))
	if err != nil {
		t.Fatalf("sink: %v", err)
	}
	s.addr = ln.Addr().String()
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	cleanup(func() { _ = srv.Close() })
	return s
}

// ServeHTTP records one CloudEvent.
func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	d := delivery{Type: r.Header.Get("ce-type"), ID: r.Header.Get("ce-id"),
		Subtype: r.Header.Get("ce-validationresult"), ContextID: r.Header.Get("ce-seqinboxcontextid")}
	d.From, _, _ = net.SplitHostPort(r.RemoteAddr)
	s.mu.Lock()
	var delay time.Duration
	for prefix, d2 := range s.delays {
		if strings.HasPrefix(d.ID, prefix) {
			delay = d2
		}
	}
	held, ok := s.hold[d.ID]
	if ok {
		delete(s.hold, d.ID)
	}
	s.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay) // the service's processing time
	}
	if ok {
		close(held)
		<-r.Context().Done()
		d.At = time.Now()
		s.record(d)
		return
	}
	w.WriteHeader(http.StatusNoContent)
	d.At, d.Accepted = time.Now(), true
	s.record(d)
}

func (s *sink) record(d delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, d)
}

// setDelay makes the sink take d for every ID with prefix.
func (s *sink) setDelay(prefix string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delays[prefix] = d
}

// holdNext makes the sink keep the next request for id open until its client goes away; the
// returned channel closes when that request arrived.
func (s *sink) holdNext(id string) <-chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold[id] = ch
	return ch
}

// accepted returns the accepted deliveries, in arrival order.
func (s *sink) accepted() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []delivery
	for _, d := range s.log {
		if d.Accepted {
			out = append(out, d)
		}
	}
	return out
}

// all returns every request the sink saw, held ones included.
func (s *sink) all() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.log...)
}

// hostService creates a selectorless Service with an EndpointSlice that points at addr (on the
// node) and returns the Service's ClusterIP:port, which pods reach through kube-proxy.
func hostService(t *testing.T, namespace, name, addr string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  ports: [{name: main, port: %[3]d, protocol: TCP, targetPort: %[3]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-host
  namespace: %[2]s
  labels: {kubernetes.io/service-name: %[1]s}
addressType: IPv4
ports: [{name: main, port: %[3]d, protocol: TCP}]
endpoints: [{addresses: ["%[4]s"]}]
`, name, namespace, p, host)
	if _, err := kubectlErr(t.Context(), []byte(manifest), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	ip := kubectl(t, "get", "service", "-n", namespace, name, "-o", "jsonpath={.spec.clusterIP}")
	return net.JoinHostPort(ip, port)
}

// producer is a Kafka client that writes to chosen partitions.
func producer(t *testing.T, cleanup func(func()), seed string) *kgo.Client {
	t.Helper()
	c, err := kgo.NewClient(kgo.SeedBrokers(seed), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	cleanup(c.Close)
	return c
}

// produce writes records synchronously.
func produce(t *testing.T, c *kgo.Client, recs []*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := c.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce %d records: %v", len(recs), err)
	}
}
