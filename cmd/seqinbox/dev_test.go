//go:build dev

package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

func TestDevelopmentCommandUsageErrorsExitTwo(t *testing.T) {
	t.Setenv(envDatabaseURL, "")
	for args, want := range map[string]string{
		"demo":                     "seqinbox demo: --database-url or SEQINBOX_DATABASE_URL is required",
		"dev kafka --topic orders": `seqinbox dev kafka: invalid argument "orders" for "--topic" flag: "orders": write name:partitions`,
		"dev kafka extra":          `seqinbox dev kafka: takes no arguments, got "extra"`,
		"dev bogus":                `seqinbox dev: unknown command "bogus" for "seqinbox dev"`,
	} {
		_, stderr, code := seqinbox(t, strings.Fields(args)...)
		if code != cli.ExitUsage || !strings.HasPrefix(stderr, want) {
			t.Errorf("seqinbox %s: exit %d, stderr %q; want %d and %q", args, code, stderr, cli.ExitUsage, want)
		}
	}
}

func TestDevKafkaServesTheRequestedTopicsUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"dev", "kafka", "--port", "0", "--topic", "payments:3", "--topic", "payments.dlq:1"}, w, io.Discard)
		_ = w.Close()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read the broker's announcement: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	_, rest, _ := strings.Cut(line, " on ")
	addr, _, _ := strings.Cut(rest, " ")

	client, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	topics, err := kadm.NewClient(client).ListTopics(ctx)
	if err != nil {
		t.Fatalf("list topics of %s (announced %q): %v", addr, line, err)
	}
	if names := topics.Names(); !slices.Equal(names, []string{"payments", "payments.dlq"}) || len(topics["payments"].Partitions) != 3 {
		t.Fatalf("topics %v (payments has %d partitions), want payments with 3 and payments.dlq", names, len(topics["payments"].Partitions))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("dev kafka ended with %v after Ctrl-C, want nil", err)
	}
}

func TestMakeDemoRunsToAVerdictThatHolds(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	server, err := testenv.ServerURL(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	bin := testenv.BuildSeqinbox(t, "dev")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	demo := exec.CommandContext(ctx, bin, "demo", "--database-url", server)
	demo.Dir = root
	demo.Env = append(os.Environ(), envDatabaseURL+"=")
	out, err := demo.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "VERDICT: holds") {
		t.Fatalf("seqinbox demo: %v\n%s", err, out)
	}
}
