package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/controller"
	"github.com/seqinbox/seqinbox/internal/dbconn"
	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/migrations"
)

// actionRequest is one operator action and its target, as the flags of `seqinbox action` name it.
type actionRequest struct {
	action                     v1alpha1.ActionType
	messageType, idempotenceID string
	sequence, contextID        string
	// requestID names the request, so that its outcome can be awaited (the SequentialInboxAction's UID).
	requestID string
	// wait is how long to await the execution after recording; zero does not wait.
	wait time.Duration
	// awaitOnly skips recording: the request was recorded by an earlier run.
	awaitOnly bool
	// inbox (namespace/name), when set, is the inbox the action is for: tables another inbox owns
	// are refused.
	inbox string
	// schema is spec.database.schema: the schema that must hold the tables.
	schema string
}

// target names what the action is on, for the report.
func (a actionRequest) target() string {
	if a.action == v1alpha1.ActionConsume || a.action == v1alpha1.ActionExpire {
		return "message " + a.messageType + "/" + a.idempotenceID
	}
	return "instance " + a.sequence + "/" + a.contextID
}

// validate checks that the action is known and has its own target, and only that one.
func (a actionRequest) validate() error {
	message := a.messageType != "" || a.idempotenceID != ""
	instance := a.sequence != "" || a.contextID != ""
	switch a.action {
	case v1alpha1.ActionConsume, v1alpha1.ActionExpire:
		if a.messageType == "" || a.idempotenceID == "" || instance {
			return fmt.Errorf("--action %s takes --type and --idempotence-id, and no --sequence or --context-id", a.action)
		}
	case v1alpha1.ActionConsumeAll, v1alpha1.ActionClose:
		if a.sequence == "" || a.contextID == "" || message {
			return fmt.Errorf("--action %s takes --sequence and --context-id, and no --type or --idempotence-id", a.action)
		}
	default:
		return fmt.Errorf("--action %q: use Consume, Expire, ConsumeAll or Close", a.action)
	}
	if (a.wait > 0 || a.awaitOnly) && a.requestID == "" {
		return errors.New("--wait and --await-only need --request-id")
	}
	return nil
}

func newActionCommand() *cobra.Command {
	var (
		req                                          actionRequest
		databaseURL, action, output, terminationPath string
	)
	cmd := &cobra.Command{
		Use:   "action --action ACTION (--type T --idempotence-id ID | --sequence S --context-id C)",
		Short: "Record an operator action on a message or an instance for the consumers to execute",
		Long: `Record an operator action as pending in the inbox's database; a consumer executes it at its
next action run, through the same claim path as a delivery.

  Consume     deliver a message now, whatever its state, then release its dependents
  Expire      mark a message processed without delivering it; its dependents become releasable
  ConsumeAll  deliver every buffered message of an instance, release conditions ignored
  Close       close an instance without delivering its buffered messages

In Kubernetes, create a SequentialInboxAction instead: the operator runs this command as a Job.`,
		Example: `  # Deliver a stuck message now
  seqinbox action --database-url postgres://app@localhost/orders \
    --action Consume --type OrderPaid --idempotence-id order-42-paid

  # Close the instance of order 42 without delivering what it buffers
  seqinbox action --database-url postgres://app@localhost/orders \
    --action Close --sequence order --context-id 42`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req.action = v1alpha1.ActionType(action)
			if err := checkOutput(output); err != nil {
				return err
			}
			if err := requireDatabaseURL(cmd, &databaseURL); err != nil {
				return err
			}
			fromEnv(cmd, "inbox", envInbox, &req.inbox)
			fromEnv(cmd, "schema", envDatabaseSchema, &req.schema)
			if req.inbox != "" && !validInboxName(req.inbox) {
				return cli.UsageErrorf("--inbox %q: must be namespace/name of a SequentialInbox", req.inbox)
			}
			if err := req.validate(); err != nil {
				return cli.UsageError(err)
			}
			return recordAndReport(cmd.Context(), databaseURL, req, output, terminationPath, cmd.OutOrStdout())
		},
	}
	addDatabaseURLFlag(cmd, &databaseURL, "PostgreSQL database of the inbox")
	cmd.Flags().StringVar(&action, "action", "", "Consume or Expire (a message), ConsumeAll or Close (an instance)")
	_ = cmd.RegisterFlagCompletionFunc("action", cobra.FixedCompletions([]string{
		string(v1alpha1.ActionConsume), string(v1alpha1.ActionExpire), string(v1alpha1.ActionConsumeAll), string(v1alpha1.ActionClose),
	}, cobra.ShellCompDirectiveNoFileComp))
	cmd.Flags().StringVar(&req.messageType, "type", "", "qualified message type of the message (Consume, Expire)")
	cmd.Flags().StringVar(&req.idempotenceID, "idempotence-id", "", "idempotence ID of the message (Consume, Expire)")
	cmd.Flags().StringVar(&req.sequence, "sequence", "", "sequence of the instance (ConsumeAll, Close)")
	cmd.Flags().StringVar(&req.contextID, "context-id", "", "context ID of the instance (ConsumeAll, Close)")
	cmd.Flags().StringVar(&req.requestID, "request-id", "", "id of the request, so that its execution can be awaited (the operator passes the SequentialInboxAction's UID)")
	cmd.Flags().DurationVar(&req.wait, "wait", 0, "after recording, wait this long for a consumer to execute the action and report its outcome")
	cmd.Flags().StringVar(&req.inbox, "inbox", "", "namespace/name of the SequentialInbox the action is for; refused when another inbox owns the tables (env "+envInbox+")")
	addSchemaFlag(cmd, &req.schema)
	cmd.Flags().BoolVar(&req.awaitOnly, "await-only", false, "do not record: only await the outcome of the request recorded earlier with --request-id")
	addOutputFlag(cmd, &output)
	cmd.Flags().StringVar(&terminationPath, "termination-message-path", "", "also write the JSON report here, within 4 KiB (Kubernetes termination message)")
	return cmd
}

// recordAndReport records the action and writes its report: JSON or text to stdout, and JSON to
// the termination message path when set (also on failure).
func recordAndReport(ctx context.Context, databaseURL string, req actionRequest, output, terminationPath string, stdout io.Writer) error {
	report := controller.ActionReport{Action: string(req.action), Target: req.target()}
	runErr := recordAction(ctx, databaseURL, req, &report)
	if runErr != nil {
		report.Error = runErr.Error()
	}
	if terminationPath != "" {
		b, err := report.EncodeWithin(migrations.TerminationMessageLimit)
		if err == nil {
			err = os.WriteFile(terminationPath, b, 0o644)
		}
		if err != nil {
			return errors.Join(runErr, fmt.Errorf("write termination message: %w", err))
		}
	}
	if output == outputJSON {
		if err := json.NewEncoder(stdout).Encode(report); err != nil {
			return errors.Join(runErr, fmt.Errorf("write report: %w", err))
		}
	} else if runErr == nil {
		line := fmt.Sprintf("%s on %s recorded; a consumer executes it at its next action run", report.Action, report.Target)
		if report.Executed {
			line = fmt.Sprintf("%s on %s: %s: %s", report.Action, report.Target, report.Outcome, report.Detail)
		}
		if _, err := fmt.Fprintln(stdout, line); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	return runErr
}

// refuseOthersTables returns the *migrations.OwnedError of tables that another inbox than the
// action's owns: its consumers would execute an action meant for another inbox. Unowned tables
// are not claimed here; the migration and the consumers do that.
func refuseOthersTables(ctx context.Context, conn *pgx.Conn, inbox string) error {
	if inbox == "" {
		return nil
	}
	owner, claimedAt, found, err := migrations.Owner(ctx, conn)
	if err != nil {
		return err
	}
	if found && owner != inbox {
		return &migrations.OwnedError{Inbox: inbox, Owner: owner, ClaimedAt: claimedAt}
	}
	return nil
}

// actionPollInterval is how often an awaited action's outcome is read.
const actionPollInterval = time.Second

// recordAction records the action as pending on its target through the inbox's functions, then
// awaits its outcome for req.wait, filling the report.
func recordAction(ctx context.Context, databaseURL string, req actionRequest, report *controller.ActionReport) error {
	conn, err := dbconn.Connect(ctx, databaseURL, logr.Discard())
	if err != nil {
		return fmt.Errorf("connect to the database: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if err := migrations.CheckSchemaName(ctx, conn, req.schema); err != nil {
		return err
	}
	if v, err := fence.CheckSchema(ctx, conn); errors.Is(err, fence.ErrSchemaOlder) {
		return fmt.Errorf("database schema version %d is older than version %d this build needs: run `seqinbox migrate` first", v, migrations.Latest())
	} else if err != nil {
		return err
	}
	if err := refuseOthersTables(ctx, conn, req.inbox); err != nil {
		return err
	}
	if !req.awaitOnly {
		if err := requestAction(ctx, conn, req); err != nil {
			return err
		}
	}
	report.Recorded = true
	if req.requestID == "" {
		return nil
	}
	deadline := time.Now().Add(req.wait)
	for {
		r, err := inbox.ActionResultOf(ctx, conn, req.requestID)
		if err != nil {
			return err
		}
		if r.Done {
			report.Executed, report.Outcome, report.Detail = true, r.Outcome, r.Detail
			return nil
		}
		if !time.Now().Before(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(actionPollInterval):
		}
	}
}

// requestAction records the action through the inbox's functions. Its errors name the action
// as the API spells it (Expire), not as the engine stores it (EXPIRE).
func requestAction(ctx context.Context, conn *pgx.Conn, req actionRequest) error {
	var err error
	switch req.action {
	case v1alpha1.ActionConsume:
		err = inbox.RequestMessageAction(ctx, conn, req.requestID, req.messageType, req.idempotenceID, inbox.ActionConsume)
	case v1alpha1.ActionExpire:
		err = inbox.RequestMessageAction(ctx, conn, req.requestID, req.messageType, req.idempotenceID, inbox.ActionExpire)
	case v1alpha1.ActionConsumeAll:
		err = inbox.RequestInstanceAction(ctx, conn, req.requestID, req.sequence, req.contextID, inbox.ActionConsumeAll)
	case v1alpha1.ActionClose:
		err = inbox.RequestInstanceAction(ctx, conn, req.requestID, req.sequence, req.contextID, inbox.ActionClose)
	default:
		return fmt.Errorf("unknown action %q", req.action)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, inbox.ErrNotFound):
		check := "--type and --idempotence-id"
		if req.action == v1alpha1.ActionConsumeAll || req.action == v1alpha1.ActionClose {
			check = "--sequence and --context-id"
		}
		return fmt.Errorf("%s on %s: %w in the inbox's tables; check %s", req.action, req.target(), inbox.ErrNotFound, check)
	default:
		// The engine's error names the action in its own spelling; its cause is what went wrong.
		if cause := errors.Unwrap(err); cause != nil {
			err = cause
		}
		return fmt.Errorf("record %s on %s: %w", req.action, req.target(), err)
	}
}
