package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"
)

// consumerCopy writes a copy of the manifest for one demo consumer: its own consumer group, the
// demo sink and the embedded broker; everything else (the sequences above all) stays as the
// sample declares it.
func consumerCopy(manifest []byte, path, group, sinkURL string, seeds []string) error {
	var doc map[string]any
	if err := yaml.Unmarshal(manifest, &doc); err != nil {
		return fmt.Errorf("read the manifest: %w", err)
	}
	if doc["kind"] != "SequentialInbox" {
		return fmt.Errorf("the manifest is a %v, want one SequentialInbox", doc["kind"])
	}
	spec, _ := doc["spec"].(map[string]any)
	kafka, _ := spec["kafka"].(map[string]any)
	sink, _ := spec["sink"].(map[string]any)
	if kafka == nil || sink == nil {
		return errors.New("the manifest has no spec.kafka or spec.sink")
	}
	kafka["consumerGroup"] = group
	kafka["bootstrapServers"] = seeds
	sink["url"] = sinkURL
	data, err := yaml.Marshal(doc)
	if err != nil {
		return fmt.Errorf("write the manifest: %w", err)
	}
	header := fmt.Sprintf("# Written by `seqinbox demo`: the sample with consumer group %s, the demo sink and the embedded broker.\n", group)
	if err := os.WriteFile(path, append([]byte(header), data...), 0o600); err != nil {
		return fmt.Errorf("write the manifest: %w", err)
	}
	return nil
}

// consumer is one `seqinbox consume` subprocess.
type consumer struct {
	// Name is the instance ID, Group the consumer group.
	Name, Group string
	// MetricsAddr and HealthAddr are its listen addresses; LogPath receives its output.
	MetricsAddr, HealthAddr, LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startConsumer starts `<binary> consume` for the manifest, with its output in logPath.
func startConsumer(binary, manifestPath, databaseURL string, seeds []string, name, group, logPath string) (*consumer, error) {
	metricsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	healthAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cmd := exec.Command(binary, "consume",
		"-f", manifestPath,
		"--database-url", databaseURL,
		"--bootstrap-servers", strings.Join(seeds, ","),
		"--metrics-bind-address", metricsAddr,
		"--health-probe-bind-address", healthAddr,
		"--instance-id", name,
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &consumer{Name: name, Group: group, MetricsAddr: metricsAddr, HealthAddr: healthAddr, LogPath: logPath,
		cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		_ = logFile.Close()
		close(c.done)
	}()
	return c, nil
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr, nil
}

// readyPoll is how often waitReady asks /readyz.
const readyPoll = 100 * time.Millisecond

// waitReady polls /readyz until it answers 200 (schema checked, version fence passed), the
// process exits, or ctx ends.
func (c *consumer) waitReady(ctx context.Context) error {
	ticker := time.NewTicker(readyPoll)
	defer ticker.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.HealthAddr+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s exited before it was ready (%w); its log:\n%s", c.Name, c.exitReason(), c.logTail(20))
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return fmt.Errorf("%s not ready: %w", c.Name, ctx.Err())
			}
			return fmt.Errorf("%s not ready: %w; its log:\n%s", c.Name, ctx.Err(), c.logTail(20))
		case <-ticker.C:
		}
	}
}

// stopGrace is how long a consumer may take to finish in-flight work and leave its group after
// SIGTERM before it is killed.
const stopGrace = 15 * time.Second

// stop sends SIGTERM (finish in-flight work, commit, leave the group;
// docs/design.md#shutdown-and-revocation), waits, and kills the process after stopGrace. It reports
// a consumer that did not exit cleanly.
func (c *consumer) stop() error {
	select {
	case <-c.done:
	default:
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(stopGrace):
			_ = c.cmd.Process.Kill()
			<-c.done
			return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", c.Name, stopGrace)
		}
	}
	if c.err != nil {
		return fmt.Errorf("%s: %w; its log:\n%s", c.Name, c.err, c.logTail(20))
	}
	return nil
}

// exited reports whether the process ended.
func (c *consumer) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// exitReason says how an exited process ended; a clean exit is an error too when the consumer
// should still run.
func (c *consumer) exitReason() error {
	if c.err == nil {
		return errors.New("exit status 0")
	}
	return c.err
}

// logTail returns the last n lines of the consumer's output, indented.
func (c *consumer) logTail(n int) string {
	f, err := os.Open(filepath.Clean(c.LogPath))
	if err != nil {
		return "    (no log: " + err.Error() + ")"
	}
	defer func() { _ = f.Close() }()
	var lines []string
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 64*1024), 1024*1024)
	for scanner.Scan() {
		lines = append(lines, "    "+scanner.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return "    (empty)"
	}
	return strings.Join(lines, "\n")
}
