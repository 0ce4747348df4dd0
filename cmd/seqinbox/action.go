package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/controller"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/migrations"
)

func init() {
	commands["action"] = command{summary: "record an operator action on a message or an instance for the consumers to execute", run: runAction}
}

// actionRequest is one operator action and its target, as the flags of `seqinbox action` name it.
type actionRequest struct {
	action                     v1alpha1.ActionType
	messageType, idempotenceID string
	sequence, contextID        string
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
	return nil
}

func runAction(ctx context.Context, args []string) error {
	return actionCommand(ctx, args, os.Stdout)
}

// actionCommand is `seqinbox action` with its output going to stdout.
func actionCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("action", flag.ContinueOnError)
	databaseURL := fs.String("database-url", os.Getenv("SEQINBOX_DATABASE_URL"), "PostgreSQL database of the inbox (env SEQINBOX_DATABASE_URL)")
	action := fs.String("action", "", "Consume or Expire (a message), ConsumeAll or Close (an instance)")
	var req actionRequest
	fs.StringVar(&req.messageType, "type", "", "qualified message type of the message (Consume, Expire)")
	fs.StringVar(&req.idempotenceID, "idempotence-id", "", "idempotence ID of the message (Consume, Expire)")
	fs.StringVar(&req.sequence, "sequence", "", "sequence of the instance (ConsumeAll, Close)")
	fs.StringVar(&req.contextID, "context-id", "", "context ID of the instance (ConsumeAll, Close)")
	output := fs.String("output", "text", "output format: text or json")
	terminationPath := fs.String("termination-message-path", "", "also write the JSON report here, within 4 KiB (Kubernetes termination message)")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	req.action = v1alpha1.ActionType(*action)
	if *output != "text" && *output != "json" {
		return fmt.Errorf("--output %q: use text or json", *output)
	}
	if *databaseURL == "" {
		return errors.New("--database-url or SEQINBOX_DATABASE_URL is required")
	}
	if err := req.validate(); err != nil {
		return err
	}

	report := controller.ActionReport{Action: string(req.action), Target: req.target()}
	runErr := recordAction(ctx, *databaseURL, req)
	report.Recorded = runErr == nil
	if runErr != nil {
		report.Error = runErr.Error()
	}
	if *terminationPath != "" {
		b, err := report.EncodeWithin(migrations.TerminationMessageLimit)
		if err == nil {
			err = os.WriteFile(*terminationPath, b, 0o644)
		}
		if err != nil {
			return errors.Join(runErr, fmt.Errorf("write termination message: %w", err))
		}
	}
	if *output == "json" {
		if err := json.NewEncoder(stdout).Encode(report); err != nil {
			return errors.Join(runErr, fmt.Errorf("write report: %w", err))
		}
	} else if runErr == nil {
		if _, err := fmt.Fprintf(stdout, "%s on %s recorded; a consumer executes it at its next action run\n", report.Action, report.Target); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	return runErr
}

// recordAction records the action as pending on its target through the inbox's functions.
func recordAction(ctx context.Context, databaseURL string, req actionRequest) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("connect to the database: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	switch req.action {
	case v1alpha1.ActionConsume:
		return inbox.RequestMessageAction(ctx, conn, req.messageType, req.idempotenceID, inbox.ActionConsume)
	case v1alpha1.ActionExpire:
		return inbox.RequestMessageAction(ctx, conn, req.messageType, req.idempotenceID, inbox.ActionExpire)
	case v1alpha1.ActionConsumeAll:
		return inbox.RequestInstanceAction(ctx, conn, req.sequence, req.contextID, inbox.ActionConsumeAll)
	case v1alpha1.ActionClose:
		return inbox.RequestInstanceAction(ctx, conn, req.sequence, req.contextID, inbox.ActionClose)
	default:
		return fmt.Errorf("unknown action %q", req.action)
	}
}
