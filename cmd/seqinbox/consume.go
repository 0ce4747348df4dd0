package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/consumer"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/sink"
)

// Outside Kubernetes the consumer serves its endpoints on the loopback interface, on ports the
// kernel picks (logged at start), so that two consumers on one host need no flags and nothing is
// exposed to the network. In a pod the operator passes :8080 and :8081.
const (
	consumeMetricsDefault = "127.0.0.1:0"
	consumeHealthDefault  = "127.0.0.1:0"
)

func newConsumeCommand() *cobra.Command {
	var (
		file, databaseURL, bootstrap, instanceID string
		stateAddr, stateCredentials              string
		serving                                  servingFlags
		logOpts                                  zap.Options
	)
	cmd := &cobra.Command{
		Use:   "consume -f inbox.yaml",
		Short: "Run the consumer of a SequentialInbox manifest",
		Long: `Run the consumer of a SequentialInbox: read its topics, claim every message in PostgreSQL,
buffer out-of-order messages, deliver released ones to the sink, and dead-letter bad records.

The manifest is the file you apply with kubectl. What the cluster would take from Secrets comes
from flags or the environment: --database-url (SEQINBOX_DATABASE_URL), --bootstrap-servers
(SEQINBOX_BOOTSTRAP_SERVERS); for spec.kafka.sasl SEQINBOX_KAFKA_PASSWORD, and
SEQINBOX_KAFKA_USERNAME unless spec.kafka.sasl.username is set; for spec.kafka.tls the files
SEQINBOX_KAFKA_CA_FILE, SEQINBOX_KAFKA_CERT_FILE and SEQINBOX_KAFKA_KEY_FILE; for spec.sink.tls
SEQINBOX_SINK_CA_FILE, SEQINBOX_SINK_CERT_FILE and SEQINBOX_SINK_KEY_FILE; for
spec.sink.bearerTokenSecretRef SEQINBOX_SINK_TOKEN_FILE. SEQINBOX_MEMORY_LIMIT (bytes, or a
quantity such as 512Mi; the operator passes the container's memory limit) sets the bound on the
bytes of buffered records to a quarter of it, unless spec.kafka.maxBufferedBytes sets it, and the
Go runtime's memory limit to 90% of it, unless GOMEMLIMIT sets that. The database schema must be
current: run 'seqinbox migrate' first.

Outside Kubernetes the endpoints listen on 127.0.0.1 on ports the kernel picks (the log names
them), so several consumers run side by side on one host. In a pod the operator passes the
addresses and the pod name as --instance-id.`,
		Example: `  # Run the sample inbox against a local database and broker
  seqinbox consume -f config/samples/inbox_v1alpha1_sequentialinbox.yaml \
    --database-url postgres://app@localhost/orders --bootstrap-servers localhost:9092

  # Fixed endpoint addresses, as in a pod
  seqinbox consume -f inbox.yaml --metrics-bind-address :8080 --health-probe-bind-address :8081`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireManifest(file); err != nil {
				return err
			}
			fromEnv(cmd, "database-url", envDatabaseURL, &databaseURL)
			if err := checkDatabaseURL(databaseURL); err != nil {
				return err
			}
			fromEnv(cmd, "bootstrap-servers", envBootstrapServers, &bootstrap)
			limit, err := memoryLimit()
			if err != nil {
				return err
			}
			setGoMemoryLimit(limit)
			inbox, err := manifest.Load(file)
			if err != nil {
				return err
			}
			if instanceID == "" {
				instanceID = defaultInstanceID()
			}
			c, err := consumer.New(consumer.Config{
				Inbox:       inbox,
				DatabaseURL: databaseURL,
				Kafka:       kafkaFromEnv(bootstrap),
				SinkAuth: sink.Auth{
					CAFile: os.Getenv(envSinkCAFile), CertFile: os.Getenv(envSinkCertFile),
					KeyFile: os.Getenv(envSinkKeyFile), TokenFile: os.Getenv(envSinkTokenFile),
				},
				MemoryLimit: limit,
				InstanceID:  instanceID,
				HealthAddr:  disabled(serving.healthAddr),
				MetricsAddr: disabled(serving.metricsAddr),
				StateAddr:   stateAddr, StateCredentialsDir: stateCredentials,
				Log: zap.New(zap.UseFlagOptions(&logOpts)).WithName("consume"),
			})
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			return c.Run(cmd.Context())
		},
	}
	addManifestFlag(cmd, &file, "", "SequentialInbox manifest, the file you apply with kubectl (required)")
	addDatabaseURLFlag(cmd, &databaseURL, "PostgreSQL connection URL, replacing spec.database.urlSecretRef")
	addBootstrapServersFlag(cmd, &bootstrap)
	serving.add(cmd.Flags(), consumeMetricsDefault, consumeHealthDefault)
	serving.addDeprecatedAliases(cmd.Flags(), consumeMetricsDefault, consumeHealthDefault)
	cmd.Flags().StringVar(&instanceID, "instance-id", "",
		"name of this consumer in the consumer registry and the logs, unique per running consumer (default: the host name and a random suffix)")
	cmd.Flags().StringVar(&stateAddr, "state-bind-address", "",
		"address of the HTTPS endpoint that serves this consumer's state to the operator; empty disables it (the operator passes it in a pod)")
	cmd.Flags().StringVar(&stateCredentials, "state-credentials-dir", "",
		"directory of the operator's credentials (tls.crt, tls.key, token) for --state-bind-address")
	addLogFlags(cmd, &logOpts)
	return cmd
}

// memoryLimit reads the container's memory limit from SEQINBOX_MEMORY_LIMIT: bytes, as the
// downward API gives it, or a quantity such as 512Mi. Unset or empty is no limit.
func memoryLimit() (int64, error) {
	v := os.Getenv(envMemoryLimit)
	if v == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() < 0 {
		return 0, cli.UsageErrorf("%s=%q: want the container's memory limit in bytes or as a quantity such as 512Mi", envMemoryLimit, v)
	}
	return q.Value(), nil
}

// setGoMemoryLimit makes the Go runtime collect harder as the process nears 90% of the
// container's memory limit (unless GOMEMLIMIT sets its own), so that the heap's growth between
// collections (about twice the live data) does not take the container past its limit.
func setGoMemoryLimit(containerLimit int64) {
	if containerLimit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(containerLimit / 10 * 9)
	}
}
