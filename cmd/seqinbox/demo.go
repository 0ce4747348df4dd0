package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/seqinbox/seqinbox/internal/demo"
)

func init() {
	commands["demo"] = command{summary: "run the claim engine locally on embedded defaults and print a report (make demo)", run: runDemo}
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	databaseURL := fs.String("database-url", os.Getenv("SEQINBOX_DATABASE_URL"),
		"PostgreSQL server (any database of it) on which the demo creates and drops its temporary database (env SEQINBOX_DATABASE_URL)")
	manifestPath := fs.String("f", "config/samples/inbox_v1alpha1_sequentialinbox.yaml", "SequentialInbox manifest the consumers run")
	timeout := fs.Duration("timeout", time.Minute, "how long the consumers may take to process the scenario")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *databaseURL == "" {
		return errors.New("--database-url is required (make demo finds a server with hack/postgres.sh)")
	}
	binary, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the seqinbox binary for the consumers: %w", err)
	}
	report, err := demo.Run(ctx, demo.Options{
		Binary: binary, DatabaseURL: *databaseURL, Manifest: *manifestPath, Out: os.Stdout, Timeout: *timeout,
	})
	if err != nil {
		return err
	}
	if err := report.Write(os.Stdout); err != nil {
		return err
	}
	if !report.Verdict.Holds() {
		return errors.New("the verdict does not hold")
	}
	return nil
}
