package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/dbconn"
	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/version"
	"github.com/seqinbox/seqinbox/migrations"
)

// migrateOptions are the flags of `seqinbox migrate` that decide what it does.
type migrateOptions struct {
	databaseURL string
	dryRun      bool
	liveWithin  time.Duration
	// inbox (namespace/name) is the inbox the tables are migrated for; takeOverFrom the inbox
	// whose tables it takes over.
	inbox, takeOverFrom string
	// schema is spec.database.schema: the schema that must hold the tables.
	schema string
}

func newMigrateCommand() *cobra.Command {
	var (
		opts                    migrateOptions
		output, terminationPath string
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the embedded schema migrations and report schema, claim protocol and live consumers",
		Long: `Apply the schema migrations embedded in this build, each once and in order, serialised by a
PostgreSQL advisory lock so that two migrators never race. Then report the schema version, the
claim protocol this build speaks, and the consumers whose heartbeat is recent.

With --inbox, the tables are migrated for that SequentialInbox (namespace/name): the first inbox
is recorded as their owner, and a run for any other inbox is refused before anything is applied,
because housekeeping and operator actions act on every row they see. --take-over-from hands the
tables of an inbox that is gone for good (renamed, replaced) to the one of --inbox.

The operator runs it as a Job from the inbox's image and reads the JSON report from the Job's
termination message (--termination-message-path).`,
		Example: `  # Apply every pending migration
  seqinbox migrate --database-url postgres://app@localhost/orders

  # Migrate for the inbox shop/orders, which becomes the owner of the tables
  seqinbox migrate --database-url postgres://app@localhost/orders --inbox shop/orders

  # Hand the tables of the deleted inbox shop/orders to shop/orders-v2
  seqinbox migrate --database-url postgres://app@localhost/orders --inbox shop/orders-v2 --take-over-from shop/orders

  # Show the schema version and the pending migrations, applying nothing
  SEQINBOX_DATABASE_URL=postgres://app@localhost/orders seqinbox migrate --dry-run -o json`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if err := requireDatabaseURL(cmd, &opts.databaseURL); err != nil {
				return err
			}
			fromEnv(cmd, "inbox", envInbox, &opts.inbox)
			fromEnv(cmd, "schema", envDatabaseSchema, &opts.schema)
			if opts.liveWithin <= 0 {
				return cli.UsageErrorf("--live-within %s: must be positive", opts.liveWithin)
			}
			for _, f := range [][2]string{{"--inbox", opts.inbox}, {"--take-over-from", opts.takeOverFrom}} {
				if f[1] != "" && !validInboxName(f[1]) {
					return cli.UsageErrorf("%s %q: must be namespace/name of a SequentialInbox", f[0], f[1])
				}
			}
			if opts.takeOverFrom != "" && opts.inbox == "" {
				return cli.UsageErrorf("--take-over-from needs --inbox: the inbox that takes the tables over")
			}
			if opts.dryRun && opts.takeOverFrom != "" {
				return cli.UsageErrorf("--take-over-from changes the owner; it cannot be a --dry-run")
			}
			return migrateAndReport(cmd.Context(), opts, output, terminationPath, cmd.OutOrStdout())
		},
	}
	addDatabaseURLFlag(cmd, &opts.databaseURL, "PostgreSQL database to migrate")
	addOutputFlag(cmd, &output)
	cmd.Flags().BoolVar(&opts.dryRun, "dry-run", false, "apply nothing; report the current schema version and the pending migrations")
	cmd.Flags().StringVar(&terminationPath, "termination-message-path", "", "also write the JSON report here, cut to 4 KiB (Kubernetes termination message)")
	cmd.Flags().StringVar(&opts.inbox, "inbox", "", "namespace/name of the SequentialInbox the tables are for; refused when another inbox owns them (env "+envInbox+")")
	addSchemaFlag(cmd, &opts.schema)
	cmd.Flags().StringVar(&opts.takeOverFrom, "take-over-from", "", "namespace/name of an inbox gone for good whose tables --inbox takes over")
	cmd.Flags().DurationVar(&opts.liveWithin, "live-within", fence.DefaultLivenessWindow, "a consumer whose last heartbeat is younger than this is reported live")
	return cmd
}

// migrateAndReport runs the migration and writes its report: JSON or text to stdout, and JSON to
// the termination message path when set (also on failure).
func migrateAndReport(ctx context.Context, opts migrateOptions, output, terminationPath string, stdout io.Writer) error {
	report, runErr := migrate(ctx, opts)
	if runErr != nil {
		report.Error = runErr.Error()
	}
	if terminationPath != "" {
		if err := writeTerminationMessage(terminationPath, report); err != nil {
			return errors.Join(runErr, err)
		}
	}
	if output == outputJSON {
		if err := json.NewEncoder(stdout).Encode(report); err != nil {
			return errors.Join(runErr, fmt.Errorf("write report: %w", err))
		}
	} else if runErr == nil {
		if err := writeMigrateText(stdout, report); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	return runErr
}

// sqlstateInvalidSchemaName is PostgreSQL's error when no schema of search_path exists to
// create a table in.
const sqlstateInvalidSchemaName = "3F000"

// explainMissingSchema turns PostgreSQL's "no schema has been selected to create in" into what
// to do: the schemas of search_path do not exist.
func explainMissingSchema(conn *pgx.Conn, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != sqlstateInvalidSchemaName {
		return err
	}
	path, ok := conn.Config().RuntimeParams["search_path"]
	if !ok {
		path = "the server's default, \"$user\", public"
	}
	return fmt.Errorf("no schema of search_path (%s) exists to create the tables in: create it (CREATE SCHEMA), or name an existing one in search_path of --database-url", path)
}

// migrate applies the embedded migrations (or, for a dry run, inspects them) and reports the
// result with the live consumers. On error the report still names this build.
func migrate(ctx context.Context, opts migrateOptions) (migrations.Report, error) {
	report := migrations.Report{ClaimProtocol: inbox.ClaimProtocol, EngineVersion: version.Version, DryRun: opts.dryRun}
	conn, err := dbconn.Connect(ctx, opts.databaseURL, logr.Discard())
	if err != nil {
		return report, fmt.Errorf("connect to the database: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if err := migrations.CheckSchemaName(ctx, conn, opts.schema); err != nil {
		return report, err
	}

	var runErr error
	switch {
	case opts.dryRun:
		st, err := migrations.Inspect(ctx, conn)
		if err != nil {
			return report, err
		}
		report.SchemaVersion, report.Pending = st.Version, st.Pending
	case opts.inbox != "":
		var res migrations.Result
		res, runErr = migrations.ApplyFor(ctx, conn, opts.inbox, opts.takeOverFrom)
		report.SchemaVersion, report.Applied = res.After, res.Applied
	default:
		var res migrations.Result
		res, runErr = migrations.ApplyConn(ctx, conn)
		report.SchemaVersion, report.Applied = res.After, res.Applied
	}
	if runErr != nil {
		runErr = explainMissingSchema(conn, runErr)
	}
	var owned *migrations.OwnedError
	if errors.As(runErr, &owned) {
		report.Owner = owned.Owner
		return report, runErr
	}
	if runErr != nil {
		return report, runErr
	}
	owner, _, _, err := migrations.Owner(ctx, conn)
	if err != nil {
		return report, err
	}
	report.Owner = owner

	live, err := fence.LiveConsumers(ctx, conn, opts.liveWithin)
	if err != nil {
		return report, err
	}
	for _, c := range live {
		lc := migrations.LiveConsumer{
			InstanceID: c.InstanceID, ConsumerGroup: c.ConsumerGroup, EngineVersion: c.EngineVersion,
			ClaimProtocol: c.ClaimProtocol, HeartbeatAt: c.HeartbeatAt.UTC().Truncate(time.Second),
		}
		if b := c.Blocked; b != nil {
			lc.Blocked = &migrations.BlockedRecord{Topic: b.Topic, Partition: b.Partition, Offset: b.Offset,
				Since: b.Since.UTC().Truncate(time.Second), Error: migrations.ShortError(b.Error)}
		}
		report.LiveConsumers = append(report.LiveConsumers, lc)
	}
	return report, nil
}

// writeTerminationMessage writes the report where Kubernetes reads the container's termination
// message, within the size Kubernetes keeps.
func writeTerminationMessage(path string, report migrations.Report) error {
	b, err := report.EncodeWithin(migrations.TerminationMessageLimit)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write termination message: %w", err)
	}
	return nil
}

// writeMigrateText prints the report for a person.
func writeMigrateText(w io.Writer, r migrations.Report) error {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	// Writes to memory cannot fail; the one write to w is checked below.
	printf := func(format string, args ...any) { _, _ = fmt.Fprintf(tw, format, args...) }
	applied := "applied now: " + versionList(r.Applied)
	if r.DryRun {
		applied = "dry run, nothing applied"
	}
	printf("schema version %d (%s; pending: %s)\n", r.SchemaVersion, applied, versionList(r.Pending))
	printf("this build: engine %s, claim protocol %s\n", r.EngineVersion, r.ClaimProtocol)
	owner := r.Owner
	if owner == "" {
		owner = "none recorded"
	}
	printf("owner of the tables: %s\n", owner)
	if len(r.LiveConsumers) == 0 {
		printf("live consumers: none\n")
	} else {
		printf("live consumers (%d):\n", len(r.LiveConsumers))
		printf("  INSTANCE\tGROUP\tENGINE\tCLAIM PROTOCOL\tLAST HEARTBEAT\n")
		for _, c := range r.LiveConsumers {
			printf("  %s\t%s\t%s\t%s\t%s\n", c.InstanceID, c.ConsumerGroup, c.EngineVersion, c.ClaimProtocol, c.HeartbeatAt.Format(time.RFC3339))
		}
		for _, c := range r.LiveConsumers {
			if b := c.Blocked; b != nil {
				printf("%s retries %s[%d] offset %d since %s: %s\n", c.InstanceID, b.Topic, b.Partition, b.Offset, b.Since.Format(time.RFC3339), b.Error)
			}
		}
	}
	_ = tw.Flush()
	_, err := io.WriteString(w, b.String())
	return err
}

// validInboxName accepts namespace/name, each a DNS label as Kubernetes names namespaces and
// SequentialInboxes.
func validInboxName(s string) bool {
	ns, name, ok := strings.Cut(s, "/")
	return ok && len(validation.IsDNS1123Label(ns)) == 0 && len(validation.IsDNS1123Label(name)) == 0
}

func versionList(vs []int) string {
	if len(vs) == 0 {
		return "none"
	}
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}
