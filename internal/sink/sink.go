// Package sink delivers released messages to the team's HTTP service as CloudEvents 1.0 in binary
// mode (docs/design.md#sink-request): an HTTP POST with the original body and content type byte for
// byte, the CloudEvents attributes as ce- headers, plus ce-seqinboxsequence and
// ce-seqinboxcontextid, the trace context and the record headers the inbox allow-lists; nothing
// else of the record. It is the engine's inbox.Listener. Transient failures (connection errors,
// timeouts, 408, 429, 5xx) are retried with exponential backoff and jitter; any other non-2xx
// answer fails at once.
package sink

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/inbox"
)

// Extension attributes that name the sequence and context of a delivered message
// (docs/design.md#sink-request).
const (
	SequenceHeader  = "ce-seqinboxsequence"
	ContextIDHeader = "ce-seqinboxcontextid"
)

// Config says where and how patiently messages are delivered.
type Config struct {
	// URL receives one POST per message.
	URL string
	// Timeout bounds one attempt.
	Timeout time.Duration
	// Retries is the number of attempts after the first for a transient failure.
	Retries int
	// InitialBackoff is the wait before the first retry; it doubles per retry up to MaxBackoff.
	InitialBackoff time.Duration
	// MaxBackoff caps one wait (also one honoured Retry-After); zero means 30s.
	MaxBackoff time.Duration
	// ForwardHeaders are record headers (names, any case) forwarded besides the CloudEvents
	// attributes, content-type and the trace context (spec.sink.forwardHeaders); New refuses
	// credential, hop-by-hop, proxy and attribute names.
	ForwardHeaders []string
	// Transport carries the requests; nil builds a pooled transport for this sink alone, secured
	// as Auth says.
	Transport http.RoundTripper
	// Auth secures the connection of the transport New builds: CA, client certificate, token.
	Auth Auth
	// Log receives a line per failed attempt; the zero value discards them.
	Log logr.Logger
}

// ConfigFor reads the delivery settings of spec.sink, so that the consumer delivering and the
// operator checking maxPollIntervalMs against the worst case use the same ones.
func ConfigFor(s *v1alpha1.SinkSpec) Config {
	retries := 0
	if s.Retries != nil {
		retries = int(*s.Retries)
	}
	return Config{Timeout: s.Timeout.Duration, Retries: retries, InitialBackoff: s.InitialBackoff.Duration, ForwardHeaders: s.ForwardHeaders}
}

// Deadline is the longest one Deliver can take with this configuration: every attempt at its
// timeout plus every backoff at its maximum. The engine's listener deadline must not be shorter,
// or the engine cancels deliveries that the sink would still retry.
func (c Config) Deadline() time.Duration {
	c = c.withDefaults()
	total := time.Duration(c.Retries+1) * c.Timeout
	b := c.backoff()
	b.Jitter = 0
	for range c.Retries {
		total += 2 * b.Step()
	}
	return total
}

func (c Config) withDefaults() Config {
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	return c
}

// backoff is the waits of one delivery's retries: InitialBackoff doubling up to MaxBackoff, each
// wait drawn from its upper half, so that the retries of many consumers spread out and no wait
// is longer than its bound (Deadline counts the bound).
func (c Config) backoff() wait.Backoff {
	return wait.Backoff{Duration: min(c.InitialBackoff, c.MaxBackoff) / 2, Factor: 2, Jitter: 1, Steps: math.MaxInt32, Cap: c.MaxBackoff / 2}
}

// Sink is the HTTP listener. It shares one client (and its connection pool) among all
// deliveries; safe for concurrent use.
type Sink struct {
	cfg     Config
	forward map[string]bool // lower-case names of allow-listed record headers
	url     string
	client  *http.Client
	metrics *Metrics
	log     logr.Logger
}

// New checks the configuration and builds the sink. m may be nil when nobody collects metrics.
func New(cfg Config, m *Metrics) (*Sink, error) {
	cfg = cfg.withDefaults()
	u, err := url.Parse(cfg.URL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("sink URL %q: %w", cfg.URL, err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return nil, fmt.Errorf("sink URL %q: need http:// or https:// and a host", cfg.URL)
	case cfg.Timeout <= 0:
		return nil, fmt.Errorf("sink timeout must be positive, got %s", cfg.Timeout)
	case cfg.Retries < 0:
		return nil, fmt.Errorf("sink retries must not be negative, got %d", cfg.Retries)
	case cfg.Retries > 0 && cfg.InitialBackoff <= 0:
		return nil, fmt.Errorf("sink initial backoff must be positive with retries, got %s", cfg.InitialBackoff)
	}
	transport := cfg.Transport
	if transport == nil {
		if transport, err = newTransport(cfg.Auth); err != nil {
			return nil, err
		}
	}
	forward, err := forwardSet(cfg.ForwardHeaders)
	if err != nil {
		return nil, err
	}
	if m == nil {
		m = NewMetrics()
	}
	log := cfg.Log
	if log.IsZero() {
		log = logr.Discard()
	}
	return &Sink{
		cfg:     cfg,
		forward: forward,
		url:     cfg.URL,
		client:  &http.Client{Transport: transport, CheckRedirect: noRedirects},
		metrics: m,
		log:     log,
	}, nil
}

// noRedirects hands a 3xx back as the answer: a POST must not silently turn into a GET elsewhere.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Close releases idle connections.
func (s *Sink) Close() { s.client.CloseIdleConnections() }

// Error is a delivery that failed after all attempts it was allowed.
type Error struct {
	// Attempts made; StatusCode of the last answer, zero when there was none.
	Attempts, StatusCode int
	// Retryable says whether the last failure was transient (retries exhausted) or final.
	Retryable bool
	Err       error
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("%d attempt(s), last: %v", e.Attempts, e.Err)
}

// Unwrap returns the last attempt's error.
func (e *Error) Unwrap() error { return e.Err }

// Deliver implements inbox.Listener: POST the message, retrying transient failures, until a 2xx
// answer, a final failure, the retries are used up, or ctx ends.
func (s *Sink) Deliver(ctx context.Context, m inbox.Message) error {
	header := s.headers(m)
	var last *attemptError
	backoff := s.cfg.backoff()
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			pause := backoff.Step()
			if last.retryAfter > pause {
				pause = min(last.retryAfter, s.cfg.MaxBackoff)
			}
			s.metrics.retries.Inc()
			if err := sleep(ctx, pause); err != nil {
				return s.failed(m, &Error{Attempts: attempt - 1, StatusCode: last.status, Retryable: true, Err: fmt.Errorf("%w (retry abandoned: %w)", last.err, err)})
			}
		}
		last = s.attempt(ctx, header, m.Record.Value)
		if last == nil {
			return nil
		}
		s.log.V(1).Info("sink attempt failed", "attempt", attempt, "type", m.QualifiedType,
			"id", m.Record.Origin.MessageID, "retryable", last.retryable, "error", last.err.Error())
		if err := ctx.Err(); err != nil {
			// The caller gave up: say so, whatever this attempt's answer was.
			return s.failed(m, &Error{Attempts: attempt, StatusCode: last.status, Retryable: last.retryable, Err: fmt.Errorf("%w (retry abandoned: %w)", last.err, err)})
		}
		if !last.retryable || attempt > s.cfg.Retries {
			return s.failed(m, &Error{Attempts: attempt, StatusCode: last.status, Retryable: last.retryable, Err: last.err})
		}
	}
}

func (s *Sink) failed(m inbox.Message, err *Error) error {
	reason := "Transport"
	if err.StatusCode != 0 {
		reason = strconv.Itoa(err.StatusCode/100) + "xx"
	}
	s.metrics.failures.WithLabelValues(reason).Inc()
	return fmt.Errorf("deliver %s %s to %s: %w", m.QualifiedType, m.Record.Origin.MessageID, s.url, err)
}

// attemptError is one failed attempt.
type attemptError struct {
	err        error
	status     int
	retryable  bool
	retryAfter time.Duration
}

// errorBodyLimit is how much of an error answer goes into the error message.
const errorBodyLimit = 256

func (s *Sink) attempt(ctx context.Context, header http.Header, body []byte) *attemptError {
	actx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return &attemptError{err: fmt.Errorf("build request: %w", err)}
	}
	req.Header = header.Clone()
	start := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		s.metrics.duration.WithLabelValues("Error").Observe(time.Since(start).Seconds())
		// A transport error or this attempt's timeout is transient; the caller's end is not
		// (the loop stops on ctx.Err()).
		return &attemptError{err: err, retryable: true}
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit))
	// Drain the rest so that the connection goes back to the pool.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	s.metrics.duration.WithLabelValues(strconv.Itoa(resp.StatusCode/100) + "xx").Observe(time.Since(start).Seconds())
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	return &attemptError{
		err:        fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(snippet))),
		status:     resp.StatusCode,
		retryable:  transientStatus(resp.StatusCode),
		retryAfter: retryAfter(resp.Header.Get("Retry-After")),
	}
}

// transientStatus says whether an answer may change on its own: timeouts, throttling, server errors.
func transientStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}

// retryAfter reads a Retry-After header in seconds; dates and garbage read as zero.
func retryAfter(v string) time.Duration {
	secs, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || secs < 0 {
		return 0
	}
	return time.Duration(secs) * time.Second
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Metrics are the sink's Prometheus collectors.
type Metrics struct {
	duration *prometheus.HistogramVec
	failures *prometheus.CounterVec
	retries  prometheus.Counter
}

// NewMetrics builds unregistered collectors; the consumer registers Collectors().
func NewMetrics() *Metrics {
	return &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "seqinbox_sink_request_duration_seconds",
			Help:    "Duration of single HTTP attempts to the sink, by answer class (2xx, 4xx, 5xx, Error).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"code"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_sink_failures_total",
			Help: "Deliveries that failed after their retries, by the last answer class (4xx, 5xx, Transport).",
		}, []string{"reason"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seqinbox_sink_retries_total",
			Help: "Attempts repeated after a transient failure.",
		}),
	}
}

// Collectors returns every collector, for the consumer to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.duration, m.failures, m.retries}
}
