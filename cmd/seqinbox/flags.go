package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	goflag "flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/consumer"
)

// The flags that several commands share are defined here, once, so that a name means the same on
// every command. Addresses follow kubebuilder's names (--metrics-bind-address,
// --health-probe-bind-address).

// Environment variables that stand in for flags; the operator passes what the referenced Secrets
// hold through them.
const (
	envDatabaseURL      = "SEQINBOX_DATABASE_URL"
	envInbox            = "SEQINBOX_INBOX"
	envDatabaseSchema   = "SEQINBOX_DATABASE_SCHEMA"
	envBootstrapServers = "SEQINBOX_BOOTSTRAP_SERVERS"
	envKafkaUsername    = "SEQINBOX_KAFKA_USERNAME"
	envKafkaPassword    = "SEQINBOX_KAFKA_PASSWORD"
	envKafkaCAFile      = "SEQINBOX_KAFKA_CA_FILE"
	envKafkaCertFile    = "SEQINBOX_KAFKA_CERT_FILE"
	envKafkaKeyFile     = "SEQINBOX_KAFKA_KEY_FILE"
	envSinkCAFile       = "SEQINBOX_SINK_CA_FILE"
	envSinkCertFile     = "SEQINBOX_SINK_CERT_FILE"
	envSinkKeyFile      = "SEQINBOX_SINK_KEY_FILE"
	envSinkTokenFile    = "SEQINBOX_SINK_TOKEN_FILE"
	// envImage is the operator's default image of consumers and Jobs (--default-image).
	envImage = "SEQINBOX_IMAGE"
	// envMemoryLimit is the consumer container's memory limit, from the downward API.
	envMemoryLimit = "SEQINBOX_MEMORY_LIMIT"
)

// Output formats of --output.
const (
	outputText = "text"
	outputJSON = "json"
	// outputYAML is for commands whose output is data (addDataOutputFlag).
	outputYAML = "yaml"
)

// addManifestFlag binds -f/--filename, the SequentialInbox manifest (the file applied with kubectl).
func addManifestFlag(cmd *cobra.Command, p *string, value, usage string) {
	cmd.Flags().StringVarP(p, "filename", "f", value, usage)
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml")
}

// requireManifest fails when -f names no manifest.
func requireManifest(file string) error {
	if file == "" {
		return cli.UsageErrorf("-f inbox.yaml is required: the SequentialInbox manifest, the file you apply with kubectl")
	}
	return nil
}

// addDatabaseURLFlag binds --database-url. Its value may come from SEQINBOX_DATABASE_URL instead
// (read by fromEnv); the environment's value is never shown as a default, since it holds a password.
func addDatabaseURLFlag(cmd *cobra.Command, p *string, usage string) {
	cmd.Flags().StringVar(p, "database-url", "", usage+" (env "+envDatabaseURL+")")
}

// addBootstrapServersFlag binds --bootstrap-servers; SEQINBOX_BOOTSTRAP_SERVERS stands in for it.
func addBootstrapServersFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "bootstrap-servers", "",
		"comma-separated Kafka brokers, replacing spec.kafka.bootstrapServers (env "+envBootstrapServers+")")
}

// addOutputFlag binds -o/--output with the values text and json; checkOutput validates it.
func addOutputFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", outputText, "output format: text or json")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{outputText, outputJSON}, cobra.ShellCompDirectiveNoFileComp))
}

// checkOutput returns a usage error for an --output value other than text or json.
func checkOutput(output string) error {
	if output != outputText && output != outputJSON {
		return cli.UsageErrorf("--output %q: use text or json", output)
	}
	return nil
}

// addDataOutputFlag binds -o/--output with the values text, json and yaml, for a command whose
// output is data that scripts read (inspect); checkDataOutput validates it.
func addDataOutputFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", outputText, "output format: text, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{outputText, outputJSON, outputYAML}, cobra.ShellCompDirectiveNoFileComp))
}

// checkDataOutput returns a usage error for an --output value other than text, json or yaml.
func checkDataOutput(output string) error {
	if output != outputText && output != outputJSON && output != outputYAML {
		return cli.UsageErrorf("--output %q: use text, json or yaml", output)
	}
	return nil
}

// writeData writes v as indented JSON or as YAML (the same fields, converted from the JSON).
func writeData(w io.Writer, output string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", output, err)
	}
	if output == outputYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("encode yaml: %w", err)
		}
	} else {
		b = append(b, '\n')
	}
	_, err = w.Write(b)
	return err
}

// addSchemaFlag adds --schema, the schema that must hold the inbox's tables
// (spec.database.schema), checked before any table is touched.
func addSchemaFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "schema", "", "schema that must hold the inbox's tables (spec.database.schema); refused when the connection resolves tables to another (env "+envDatabaseSchema+")")
}

// fromEnv sets *p from the environment variable when the flag was not given on the command line.
func fromEnv(cmd *cobra.Command, flag, env string, p *string) {
	if !cmd.Flags().Changed(flag) {
		if v, ok := os.LookupEnv(env); ok {
			*p = v
		}
	}
}

// requireDatabaseURL reads --database-url or SEQINBOX_DATABASE_URL and fails when neither is set
// or the value is no PostgreSQL URL.
func requireDatabaseURL(cmd *cobra.Command, p *string) error {
	fromEnv(cmd, "database-url", envDatabaseURL, p)
	if *p == "" {
		return cli.UsageErrorf("--database-url or %s is required", envDatabaseURL)
	}
	return checkDatabaseURL(*p)
}

// checkDatabaseURL refuses a URL of another database than PostgreSQL, naming its scheme only
// (the URL may hold a password). A keyword/value string (host=... dbname=...) passes, as pgx
// reads both forms.
func checkDatabaseURL(url string) error {
	scheme, _, isURL := strings.Cut(url, "://")
	if !isURL || scheme == "postgres" || scheme == "postgresql" {
		return nil
	}
	return cli.UsageErrorf("--database-url %s://…: seqinbox keeps the inbox in PostgreSQL; pass postgres://USER:PASSWORD@HOST:5432/DATABASE", scheme)
}

// kafkaFromEnv is what spec.kafka's Secrets hold, from the environment, with the brokers of
// --bootstrap-servers (comma-separated; empty keeps spec.kafka.bootstrapServers).
func kafkaFromEnv(bootstrap string) consumer.Kafka {
	k := consumer.Kafka{
		Username: os.Getenv(envKafkaUsername), Password: os.Getenv(envKafkaPassword),
		CAFile: os.Getenv(envKafkaCAFile), CertFile: os.Getenv(envKafkaCertFile), KeyFile: os.Getenv(envKafkaKeyFile),
	}
	if bootstrap != "" {
		k.BootstrapServers = strings.Split(bootstrap, ",")
	}
	return k
}

// servingFlags are the addresses of the HTTP endpoints of a long-running command.
type servingFlags struct {
	metricsAddr, healthAddr string
}

// add binds --metrics-bind-address and --health-probe-bind-address with the given defaults.
func (s *servingFlags) add(fs *pflag.FlagSet, metricsDefault, healthDefault string) {
	fs.StringVar(&s.metricsAddr, "metrics-bind-address", metricsDefault, "address of the Prometheus /metrics endpoint; 0 disables it")
	fs.StringVar(&s.healthAddr, "health-probe-bind-address", healthDefault, "address of the /healthz and /readyz endpoints; 0 disables them")
}

// addDeprecatedAliases binds the names that `consume` used before they matched the operator's,
// hidden, for one release.
func (s *servingFlags) addDeprecatedAliases(fs *pflag.FlagSet, metricsDefault, healthDefault string) {
	fs.StringVar(&s.metricsAddr, "metrics-addr", metricsDefault, "")
	fs.StringVar(&s.healthAddr, "health-addr", healthDefault, "")
	_ = fs.MarkDeprecated("metrics-addr", "use --metrics-bind-address")
	_ = fs.MarkDeprecated("health-addr", "use --health-probe-bind-address")
}

// disabled maps kubebuilder's "0" (no endpoint) to the empty address the servers take.
func disabled(addr string) string {
	if addr == "0" {
		return ""
	}
	return addr
}

// addLogFlags binds controller-runtime's --zap-* logging flags.
func addLogFlags(cmd *cobra.Command, opts *zap.Options) {
	fs := goflag.NewFlagSet(cmd.Name(), goflag.ContinueOnError)
	opts.BindFlags(fs)
	cmd.Flags().AddGoFlagSet(fs)
}

// defaultInstanceID names a consumer outside Kubernetes: the host name and a random suffix, so that
// two consumers on one host register apart. In a pod the operator passes the pod name.
func defaultInstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "seqinbox"
	}
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix) // crypto/rand.Read never fails
	return strings.ToLower(host) + "-" + hex.EncodeToString(suffix)
}
