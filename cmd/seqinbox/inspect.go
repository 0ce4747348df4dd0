package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/dbconn"
	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/migrations"
)

// inspectOptions are the flags of `seqinbox inspect`.
type inspectOptions struct {
	file, databaseURL, schema, message, output string
	query                                      inbox.InspectQuery
}

func newInspectCommand() *cobra.Command {
	var opts inspectOptions
	cmd := &cobra.Command{
		Use:   "inspect -f inbox.yaml (--context-id ID [--sequence S] | --message TYPE/ID)",
		Short: "Show one sequence instance as the engine sees it, and what its waiting messages wait for",
		Long: `Show one sequence instance as the engine sees it: whether it is open or closed, until when it is
retained or kept for duplicates, every message with its type, idempotence ID, state and times, and
for each WAITING message its release condition and which predecessors are still missing, in
words. --message TYPE/ID shows one message (qualified type and idempotence ID; everything after
the first / is the ID) and its instance.

The manifest gives the sequences and their release conditions; the database comes from
--database-url or SEQINBOX_DATABASE_URL. Inspect only reads, in one read-only transaction: it
changes no row, and never reads or prints a payload. In Kubernetes, 'kubectl seqinbox inspect'
runs it in a consumer pod, with the pod's manifest and credentials.`,
		Example: `  # What does order 42 wait for?
  seqinbox inspect -f inbox.yaml --database-url postgres://app@localhost/orders --context-id 42

  # One message and its instance, as JSON
  seqinbox inspect -f inbox.yaml --message OrderShipped/order-42-shipped -o json`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkDataOutput(opts.output); err != nil {
				return err
			}
			if err := requireManifest(opts.file); err != nil {
				return err
			}
			if opts.message != "" {
				typ, id, ok := strings.Cut(opts.message, "/")
				if !ok || typ == "" || id == "" {
					return cli.UsageErrorf("--message %q: want TYPE/ID, the qualified type and the idempotence ID, such as OrderPaid/order-42-paid", opts.message)
				}
				opts.query.MessageType, opts.query.IdempotenceID = typ, id
			}
			if opts.query.ContextID == "" && opts.message == "" {
				return cli.UsageErrorf("--context-id or --message is required: the instance of a context ID, or one message")
			}
			if err := requireDatabaseURL(cmd, &opts.databaseURL); err != nil {
				return err
			}
			fromEnv(cmd, "schema", envDatabaseSchema, &opts.schema)
			return inspect(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	addManifestFlag(cmd, &opts.file, "", "SequentialInbox manifest, for the sequences and their release conditions (required)")
	addDatabaseURLFlag(cmd, &opts.databaseURL, "PostgreSQL database of the inbox")
	addSchemaFlag(cmd, &opts.schema)
	cmd.Flags().StringVar(&opts.query.ContextID, "context-id", "", "context ID of the instance")
	cmd.Flags().StringVar(&opts.query.Sequence, "sequence", "", "sequence of the instance; needed when instances of several sequences have the context ID")
	cmd.Flags().StringVar(&opts.message, "message", "", "one message, as TYPE/ID: its qualified type and idempotence ID")
	addDataOutputFlag(cmd, &opts.output)
	return cmd
}

// inspect reads the instance the options name through inbox.Inspect and prints it.
func inspect(ctx context.Context, opts inspectOptions, stdout io.Writer) error {
	in, err := manifest.Load(opts.file)
	if err != nil {
		return err
	}
	set, errs := declaration.Compile(&in.Spec)
	if len(errs) > 0 {
		return fmt.Errorf("%s: invalid SequentialInbox %s: %w", opts.file, in.Name, errs.ToAggregate())
	}
	if opts.schema == "" {
		opts.schema = in.Spec.Database.Schema
	}
	conn, err := dbconn.Connect(ctx, opts.databaseURL, logr.Discard())
	if err != nil {
		return fmt.Errorf("connect to the database: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if err := migrations.CheckSchemaName(ctx, conn, opts.schema); err != nil {
		return err
	}
	if v, err := fence.CheckSchema(ctx, conn); errors.Is(err, fence.ErrSchemaOlder) {
		return fmt.Errorf("database schema version %d is older than version %d this build needs: run `seqinbox migrate` first", v, migrations.Latest())
	} else if err != nil {
		return err
	}
	if err := refuseOthersTables(ctx, conn, manifest.InboxName(in)); err != nil {
		return err
	}
	inspection, err := inbox.Inspect(ctx, conn, set, opts.query)
	switch {
	case errors.Is(err, inbox.ErrNoInstance):
		return fmt.Errorf("%w: none was created for it, or housekeeping deleted it after its retention or duplicate protection; check --context-id and --sequence", err)
	case errors.Is(err, inbox.ErrAmbiguousContext):
		return fmt.Errorf("%w: pick one with --sequence", err)
	case errors.Is(err, inbox.ErrNoMessage):
		return fmt.Errorf("%w with this qualified type and idempotence ID: it never arrived sequenced, or housekeeping deleted its instance; check --message", err)
	case err != nil:
		return err
	}
	if opts.output != outputText {
		return writeData(stdout, opts.output, inspection)
	}
	return writeInspectText(stdout, inspection)
}

// writeInspectText writes the inspection for a person: the instance, its messages as a table,
// then what each WAITING message waits for.
func writeInspectText(w io.Writer, in *inbox.Inspection) error {
	var b strings.Builder
	i := in.Instance
	fmt.Fprintf(&b, "Instance %s/%s: %s\n", i.Sequence, i.ContextID, i.State)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintf(tw, "  Created\t%s\n", stamp(i.CreatedAt))
	for _, line := range instanceWindows(in) {
		_, _ = fmt.Fprintf(tw, "  %s\t%s\n", line[0], line[1])
	}
	if !i.Declared {
		_, _ = fmt.Fprintf(tw, "  Declared\tno: the manifest declares no sequence %s\n", i.Sequence)
	} else if i.State == "OPEN" {
		missing := "none: the next release closes it"
		if len(i.Missing) > 0 {
			missing = strings.Join(i.Missing, ", ") + " (it closes when every type of the sequence is processed)"
		}
		_, _ = fmt.Fprintf(tw, "  Not processed\t%s\n", missing)
	}
	if i.PendingAction != "" {
		_, _ = fmt.Fprintf(tw, "  Pending action\t%s, requested; a consumer executes it at its next action run\n", i.PendingAction)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(&b, "\nMessages (%d)\n", len(in.Messages))
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "  TYPE\tIDEMPOTENCE ID\tSTATE\tARRIVED\tSTATE SINCE\tRECORD\tNOTES")
	for _, m := range in.Messages {
		_, _ = fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Type, m.IdempotenceID, m.State, stamp(m.ArrivedAt), stamp(m.StateSince),
			recordOf(m), messageNotes(m))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	var waiting []string
	for _, m := range in.Messages {
		if m.Waits != nil {
			waiting = append(waiting, "  "+m.Type+"/"+m.IdempotenceID+": "+m.Waits.Text)
		}
	}
	if len(waiting) > 0 {
		fmt.Fprintf(&b, "\nWaiting\n%s\n", strings.Join(waiting, "\n"))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// instanceWindows says until when the instance waits for its messages or is kept for duplicates,
// and what housekeeping does then, measured against the database's clock.
func instanceWindows(in *inbox.Inspection) [][2]string {
	i := in.Instance
	switch {
	case i.State == "CLOSED" && i.RemoveAfter != nil:
		return [][2]string{{"Closed", stamp(*i.ClosedAt)},
			{"Kept until", stamp(*i.RemoveAfter) + ": until then a duplicate of its messages is recognised; then housekeeping deletes it with its claims"}}
	case i.State == "CLOSED":
		return [][2]string{{"Closed", stampOrDash(i.ClosedAt)},
			{"Kept until", "the next housekeeping run sets the end of its duplicate protection"}}
	case i.RemoveAfter != nil:
		return [][2]string{{"Retained until", stamp(i.RetainUntil) + " (ended)"},
			{"Removed after", stamp(*i.RemoveAfter) + ": housekeeping then deletes it and dead-letters its waiting messages"}}
	case !i.RetainUntil.After(in.Now):
		return [][2]string{{"Retained until", stamp(i.RetainUntil) + " (ended): the next housekeeping run marks it for removal"}}
	default:
		return [][2]string{{"Retained until", stamp(i.RetainUntil) + ": its messages may arrive until then; past it, housekeeping removes the instance and dead-letters its waiting messages"}}
	}
}

// recordOf is where the message's latest delivery was read from: topic[partition]@offset.
func recordOf(m inbox.InspectedMessage) string {
	if m.Topic == "" || m.Partition == nil || m.Offset == nil {
		return "-"
	}
	return m.Topic + "[" + strconv.Itoa(int(*m.Partition)) + "]@" + strconv.FormatInt(*m.Offset, 10)
}

// messageNotes are what else a person should know of a message.
func messageNotes(m inbox.InspectedMessage) string {
	var notes []string
	if m.State == "FAILED" && !m.Claimed {
		notes = append(notes, "no claim: a resend or a consume action retries it")
	}
	if m.PendingAction != "" {
		notes = append(notes, m.PendingAction+" requested")
	}
	if m.Rows > 1 {
		notes = append(notes, strconv.Itoa(m.Rows)+" stored rows (historical duplicates); this one stands for the message")
	}
	if len(notes) == 0 {
		return "-"
	}
	return strings.Join(notes, "; ")
}

// stamp renders a time of the inspection: UTC, to the second.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// stampOrDash is stamp, or "-" for no time.
func stampOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return stamp(*t)
}
