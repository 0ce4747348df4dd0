package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/seqinbox/seqinbox/internal/consumer"
	"github.com/seqinbox/seqinbox/internal/manifest"
)

func init() {
	commands["consume"] = command{summary: "run the consumer of a SequentialInbox manifest (-f inbox.yaml)", run: runConsume}
}

// Environment variables through which the operator passes what the referenced Secrets hold.
const (
	envDatabaseURL      = "SEQINBOX_DATABASE_URL"
	envBootstrapServers = "SEQINBOX_BOOTSTRAP_SERVERS"
	envKafkaUsername    = "SEQINBOX_KAFKA_USERNAME"
	envKafkaPassword    = "SEQINBOX_KAFKA_PASSWORD"
	envKafkaCAFile      = "SEQINBOX_KAFKA_CA_FILE"
)

func runConsume(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	file := fs.String("f", "", "SequentialInbox manifest, the file you apply with kubectl (required)")
	databaseURL := fs.String("database-url", os.Getenv(envDatabaseURL), "PostgreSQL connection URL (env "+envDatabaseURL+"); replaces spec.database.urlSecretRef")
	bootstrap := fs.String("bootstrap-servers", os.Getenv(envBootstrapServers), "comma-separated Kafka brokers (env "+envBootstrapServers+"); replaces spec.kafka.bootstrapServers")
	healthAddr := fs.String("health-addr", ":8081", "address of /healthz and /readyz")
	metricsAddr := fs.String("metrics-addr", ":8080", "address of /metrics")
	hostname, _ := os.Hostname()
	instanceID := fs.String("instance-id", hostname, "name of this consumer in the consumer registry and logs (the pod name in Kubernetes)")
	logOpts := zap.Options{}
	logOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *file == "" {
		fmt.Fprintln(os.Stderr, "seqinbox consume: -f inbox.yaml is required")
		fs.Usage()
		return errUsage
	}
	inbox, err := manifest.Load(*file)
	if err != nil {
		return err
	}
	var servers []string
	if *bootstrap != "" {
		servers = strings.Split(*bootstrap, ",")
	}
	c, err := consumer.New(consumer.Config{
		Inbox:       inbox,
		DatabaseURL: *databaseURL,
		Kafka: consumer.Kafka{
			BootstrapServers: servers,
			Username:         os.Getenv(envKafkaUsername),
			Password:         os.Getenv(envKafkaPassword),
			CAFile:           os.Getenv(envKafkaCAFile),
		},
		InstanceID:  *instanceID,
		HealthAddr:  *healthAddr,
		MetricsAddr: *metricsAddr,
		Log:         zap.New(zap.UseFlagOptions(&logOpts)).WithName("consume"),
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}
