package consumer

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/dbconn"
	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/kafkaauth"
	"github.com/seqinbox/seqinbox/internal/sink"
)

// Config is what one consumer runs: the SequentialInbox (with its CRD defaults applied, as
// manifest.Load returns it) and what the cluster would provide from Secrets.
type Config struct {
	// Inbox is the SequentialInbox this consumer runs.
	Inbox *v1alpha1.SequentialInbox
	// DatabaseURL is the PostgreSQL connection URL (the Secret spec.database.urlSecretRef names).
	DatabaseURL string
	// Kafka holds the broker addresses and credentials that override or complete spec.kafka.
	Kafka Kafka
	// SinkAuth is what spec.sink.tls and spec.sink.bearerTokenSecretRef's Secrets hold, as files.
	SinkAuth sink.Auth
	// MemoryLimit is the consumer container's memory limit in bytes (the operator passes it as
	// SEQINBOX_MEMORY_LIMIT); without spec.kafka.maxBufferedBytes a quarter of it bounds the
	// records the consumer holds. Zero means no limit.
	MemoryLimit int64
	// InstanceID names this consumer in the registry and the logs; unique per running consumer.
	InstanceID string
	// HealthAddr serves /healthz and /readyz, MetricsAddr serves /metrics; empty serves nothing
	// (Handler serves all three for in-process use).
	HealthAddr, MetricsAddr string
	// StateAddr serves the consumer's State to the operator over HTTPS with the credentials in
	// StateCredentialsDir (consumerstate.Files); empty serves nothing.
	StateAddr, StateCredentialsDir string
	// Fence tunes the registry heartbeat; zero fields take the fence defaults. Its Clock is
	// replaced by Clock.
	Fence fence.Config
	// ActionsInterval is how often pending operator actions are run; zero means 2s.
	ActionsInterval time.Duration
	// CommitInterval is how often processed offsets are committed between rebalances; zero means 1s.
	CommitInterval time.Duration
	// Clock paces heartbeats, backoffs and periodic work and tells the engine the time; nil is
	// the real clock.
	Clock clock.Clock
	// Log receives structured logs; the zero value discards them.
	Log logr.Logger
	// OnRecord, when set, is told what became of every finished record, from the goroutine that
	// processed it (records of a partition run concurrently); it must not block. The demo and
	// tests read it.
	OnRecord func(Event)

	// build replaces what this binary speaks (engine version, claim protocol) in tests that run
	// consumers of other builds side by side; the zero value is this binary's.
	build build
	// hooks are franz-go hooks of the group client; benchmarks take the time a record was fetched.
	hooks []kgo.Hook
}

// Kafka completes spec.kafka with what the cluster would provide from Secrets.
type Kafka struct {
	// BootstrapServers replaces spec.kafka.bootstrapServers when not empty.
	BootstrapServers []string
	// Username and Password authenticate with spec.kafka.sasl.mechanism; required when it is set.
	Username, Password string
	// CAFile is a PEM CA bundle for spec.kafka.tls; empty uses the system roots.
	CAFile string
	// CertFile and KeyFile are the PEM client certificate and key of spec.kafka.tls.clientCertificate.
	CertFile, KeyFile string
}

// Defaults of the runtime's own knobs (not part of the SequentialInbox).
const (
	defaultActionsInterval = 2 * time.Second
	defaultCommitInterval  = time.Second
	// maxPollRecords bounds one poll; partitions past pauseBacklog queued records stop fetching
	// until their worker is down to resumeBacklog (besides the bound in bytes, memory.go).
	maxPollRecords = 500
	pauseBacklog   = 1000
	resumeBacklog  = 250
	// commitTimeout bounds one offset commit, publishTimeout one dead-letter produce (franz-go
	// would otherwise retry an unreachable broker forever and hold a revocation up).
	commitTimeout = 10 * time.Second
	// fetchMaxWait bounds the broker's long poll (franz-go's default is 5s).
	fetchMaxWait   = time.Second
	publishTimeout = 30 * time.Second
	// retryMin and retryMax bound the backoff after an infrastructure error or a failed
	// dead-letter produce; the record is retried, never skipped.
	retryMin = 100 * time.Millisecond
	retryMax = 10 * time.Second
	// keepAlive configures TCP keepalives to PostgreSQL, so that the server notices a dead
	// consumer (and rolls back its claims) within about idle + interval*count.
	keepAliveIdle     = 15 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveCount    = 3
)

// RecordTimeout is the processing deadline of one record for a maxPollIntervalMs: nine tenths of
// it, so that after the last record of a revoked partition there is time left to commit and
// rejoin within the rebalance timeout.
func RecordTimeout(maxPollInterval time.Duration) time.Duration {
	return maxPollInterval * 9 / 10
}

func (c *Config) validate() error {
	switch {
	case c.Inbox == nil:
		return errors.New("no SequentialInbox")
	case c.DatabaseURL == "":
		return fmt.Errorf("no database URL: spec.database.urlSecretRef names Secret %q key %q; outside Kubernetes pass --database-url or SEQINBOX_DATABASE_URL",
			c.Inbox.Spec.Database.URLSecretRef.Name, c.Inbox.Spec.Database.URLSecretRef.Key)
	case c.InstanceID == "":
		return errors.New("no instance ID")
	case len(c.bootstrapServers()) == 0:
		return errors.New("no bootstrap servers")
	case c.Inbox.Spec.Sink.TLS != nil && c.Inbox.Spec.Sink.TLS.ClientCertificate != nil && (c.SinkAuth.CertFile == "" || c.SinkAuth.KeyFile == ""):
		return errors.New("spec.sink.tls.clientCertificate needs the certificate and key files: SEQINBOX_SINK_CERT_FILE and SEQINBOX_SINK_KEY_FILE")
	case c.Inbox.Spec.Sink.BearerTokenSecretRef != nil && c.SinkAuth.TokenFile == "":
		return errors.New("spec.sink.bearerTokenSecretRef needs the token file: SEQINBOX_SINK_TOKEN_FILE")
	case c.Inbox.Spec.Database.PoolSize < 2:
		return fmt.Errorf("spec.database.poolSize %d: a record in flight holds up to two connections, need at least 2", c.Inbox.Spec.Database.PoolSize)
	case c.Inbox.Spec.Kafka.MaxPollIntervalMs <= 0:
		return fmt.Errorf("spec.kafka.maxPollIntervalMs %d must be positive", c.Inbox.Spec.Kafka.MaxPollIntervalMs)
	case c.Inbox.Spec.Kafka.MaxBufferedBytes != nil && c.Inbox.Spec.Kafka.MaxBufferedBytes.Value() < minMaxBufferedBytes:
		return fmt.Errorf("spec.kafka.maxBufferedBytes %s must be at least 1Mi", c.Inbox.Spec.Kafka.MaxBufferedBytes)
	case c.StateAddr != "" && c.StateCredentialsDir == "":
		return errors.New("the consumer state address needs the directory of the operator's credentials")
	case c.MemoryLimit < 0:
		return fmt.Errorf("memory limit %d must not be negative", c.MemoryLimit)
	}
	if err := checkKafkaMaterial(&c.Inbox.Spec.Kafka, c.Kafka); err != nil {
		return err
	}
	return checkGroupTimes(&c.Inbox.Spec.Kafka)
}

// checkGroupTimes checks the session timeout and heartbeat interval against each other and the
// poll interval, as the CRD does; zero takes franz-go's default (a manifest gets the CRD's).
func checkGroupTimes(k *v1alpha1.KafkaSpec) error {
	session, heartbeat := k.SessionTimeoutMs, k.HeartbeatIntervalMs
	switch {
	case session < 0 || heartbeat < 0:
		return fmt.Errorf("spec.kafka.sessionTimeoutMs %d and heartbeatIntervalMs %d must not be negative", session, heartbeat)
	case session > k.MaxPollIntervalMs:
		return fmt.Errorf("spec.kafka.sessionTimeoutMs %d exceeds spec.kafka.maxPollIntervalMs %d: a crashed consumer would hold its partitions longer than a live one may take for a record",
			session, k.MaxPollIntervalMs)
	case session > 0 && heartbeat > 0 && 3*heartbeat > session:
		return fmt.Errorf("spec.kafka.heartbeatIntervalMs %d is more than a third of spec.kafka.sessionTimeoutMs %d: one late heartbeat would cost the consumer its partitions",
			heartbeat, session)
	}
	return nil
}

// groupTimes are the franz-go options for the session timeout and heartbeat interval of the spec.
func groupTimes(k *v1alpha1.KafkaSpec) []kgo.Opt {
	var opts []kgo.Opt
	if k.SessionTimeoutMs > 0 {
		opts = append(opts, kgo.SessionTimeout(time.Duration(k.SessionTimeoutMs)*time.Millisecond))
	}
	if k.HeartbeatIntervalMs > 0 {
		opts = append(opts, kgo.HeartbeatInterval(time.Duration(k.HeartbeatIntervalMs)*time.Millisecond))
	}
	return opts
}

func (c *Config) bootstrapServers() []string {
	if len(c.Kafka.BootstrapServers) > 0 {
		return c.Kafka.BootstrapServers
	}
	return c.Inbox.Spec.Kafka.BootstrapServers
}

func (c *Config) maxPollInterval() time.Duration {
	return time.Duration(c.Inbox.Spec.Kafka.MaxPollIntervalMs) * time.Millisecond
}

// inFlightLimit is how many records may be processed at once: each holds up to two connections.
func (c *Config) inFlightLimit() int {
	return max(1, int(c.Inbox.Spec.Database.PoolSize)/2)
}

// ConnectionOptions are the franz-go options that reach the brokers of a SequentialInbox: seed
// brokers, TLS and SASL. The consumer, its dead-letter producer and the retry command use them.
// The SASL user name is spec.kafka.sasl.username unless k names one (the operator passes the
// user of spec.kafka.sasl.usernameSecretRef as SEQINBOX_KAFKA_USERNAME).
func ConnectionOptions(spec *v1alpha1.KafkaSpec, k Kafka) ([]kgo.Opt, error) {
	if err := checkKafkaMaterial(spec, k); err != nil {
		return nil, err
	}
	seeds := k.BootstrapServers
	if len(seeds) == 0 {
		seeds = spec.BootstrapServers
	}
	m := kafkaauth.Material{Username: saslUsername(spec, k), Password: k.Password}
	files := []struct {
		what, env, path string
		into            *[]byte
	}{
		{"CA bundle", envCAFile, k.CAFile, &m.CA},
		{"client certificate", envCertFile, k.CertFile, &m.Certificate},
		{"client key", envKeyFile, k.KeyFile, &m.PrivateKey},
	}
	for _, f := range files {
		if f.path == "" {
			continue
		}
		data, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("kafka %s (%s): %w", f.what, f.env, err)
		}
		*f.into = data
	}
	if ref := caSecretRef(spec); ref != nil && !x509.NewCertPool().AppendCertsFromPEM(m.CA) {
		return nil, fmt.Errorf("spec.kafka.tls.caSecretRef (Secret %s key %s): %s %s holds no PEM certificate; point it at the CA bundle of the brokers",
			ref.Name, ref.Key, envCAFile, k.CAFile)
	}
	auth, err := kafkaauth.Options(spec, m)
	if err != nil {
		return nil, err
	}
	return append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, auth...), nil
}

// checkKafkaMaterial refuses a spec.kafka whose Secrets' contents k lacks, naming the field and
// the variable that carries its content (in a pod the operator sets them from the Secrets).
func checkKafkaMaterial(spec *v1alpha1.KafkaSpec, k Kafka) error {
	if s := spec.SASL; s != nil {
		if saslUsername(spec, k) == "" {
			ref := s.UsernameSecretRef
			if ref == nil {
				return fmt.Errorf("spec.kafka.sasl (%s) has no user name: set spec.kafka.sasl.username, or %s", s.Mechanism, envUsername)
			}
			return fmt.Errorf("spec.kafka.sasl.usernameSecretRef (Secret %s key %s): set %s to the user name it holds", ref.Name, ref.Key, envUsername)
		}
		if k.Password == "" {
			ref := s.PasswordSecretRef
			return fmt.Errorf("spec.kafka.sasl.passwordSecretRef (Secret %s key %s): set %s to the password it holds", ref.Name, ref.Key, envPassword)
		}
	}
	if ref := caSecretRef(spec); ref != nil && k.CAFile == "" {
		return fmt.Errorf("spec.kafka.tls.caSecretRef (Secret %s key %s): set %s to a file with the CA bundle it holds", ref.Name, ref.Key, envCAFile)
	}
	if spec.TLS != nil && spec.TLS.ClientCertificate != nil && (k.CertFile == "" || k.KeyFile == "") {
		return fmt.Errorf("spec.kafka.tls.clientCertificate needs the certificate and key files: %s and %s", envCertFile, envKeyFile)
	}
	return nil
}

// saslUsername is the SASL user name: k's, else spec.kafka.sasl.username.
func saslUsername(spec *v1alpha1.KafkaSpec, k Kafka) string {
	if k.Username != "" || spec.SASL == nil {
		return k.Username
	}
	return spec.SASL.Username
}

// caSecretRef is spec.kafka.tls.caSecretRef, nil when unset.
func caSecretRef(spec *v1alpha1.KafkaSpec) *corev1.SecretKeySelector {
	if spec.TLS == nil {
		return nil
	}
	return spec.TLS.CASecretRef
}

// Variables through which a pod gets what spec.kafka's Secrets hold; named in errors.
const (
	envUsername = "SEQINBOX_KAFKA_USERNAME"
	envPassword = "SEQINBOX_KAFKA_PASSWORD"
	envCAFile   = "SEQINBOX_KAFKA_CA_FILE"
	envCertFile = "SEQINBOX_KAFKA_CERT_FILE"
	envKeyFile  = "SEQINBOX_KAFKA_KEY_FILE"
)

// kafkaLogger passes franz-go's warnings and errors (broker connections, group management) to
// the consumer's log.
type kafkaLogger struct{ log logr.Logger }

// Level implements kgo.Logger.
func (kafkaLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

// Log implements kgo.Logger.
func (l kafkaLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelError {
		l.log.Error(nil, msg, keyvals...)
		return
	}
	l.log.Info(msg, keyvals...)
}

// newPool opens the consumer's PostgreSQL pool: poolSize connections with TCP keepalives, so
// that the server rolls back the claims of a consumer that died without closing its connections,
// preparing statements unless a pooler answers (dbconn).
func newPool(ctx context.Context, url string, size int32, log logr.Logger) (*pgxpool.Pool, error) {
	cfg, err := dbconn.PoolConfig(url, log)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	cfg.MaxConns = size
	dialer := &net.Dialer{
		Timeout: 10 * time.Second,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
		},
	}
	cfg.ConnConfig.DialFunc = dialer.DialContext
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database pool: %w", err)
	}
	return pool, nil
}

// engineConfig derives the claim engine's configuration from the spec.
func engineConfig(spec *v1alpha1.SequentialInboxSpec, listenerDeadline time.Duration, clk clock.PassiveClock, log logr.Logger) inbox.Config {
	cfg := inbox.Config{
		ListenerDeadline: listenerDeadline,
		IdleLockTimeout:  spec.Database.IdleLockTimeout.Duration,
		Clock:            clk,
		Log:              log.WithName("engine"),
	}
	if spec.SequencingStartTime != nil {
		cfg.SequencingStartTime = spec.SequencingStartTime.Time
	}
	return cfg
}
