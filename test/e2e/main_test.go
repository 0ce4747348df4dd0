//go:build e2e

// Package e2e tests seqinbox on a real Kubernetes cluster, the way a user runs it: the images
// built by hack/image.sh, the install bundle dist/install.yaml applied with kubectl, real pods
// of the operator, the migration Job and the consumers, a Kafka broker, PostgreSQL and a
// recording sink reachable from the pods. It brings the local cluster up (hack/cluster/up.sh)
// when it does not run; when that fails, the suite fails and says why. Run: make e2e.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// env is what TestMain learnt about the cluster and the images.
var env struct {
	root, kubectl, kubeconfig, nodeIP string
	image, legacyImage                string
	// steps are the durations of the set-up steps, reported at the end.
	steps []string
}

func TestMain(m *testing.M) {
	if err := setUp(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	fmt.Fprintf(os.Stderr, "e2e: set-up steps: %s\n", strings.Join(env.steps, ", "))
	os.Exit(code)
}

// setUp starts (or finds) the cluster and builds and loads the images.
func setUp() error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	env.root = root
	version := envOr("VERSION", "v0.1.0-dev")
	env.image = envOr("IMG", "ghcr.io/seqinbox/seqinbox:"+version)
	env.legacyImage = envOr("IMG_LEGACY", "ghcr.io/seqinbox/seqinbox-legacy:"+version)
	if _, err := os.Stat(filepath.Join(root, "dist/install.yaml")); err != nil {
		return fmt.Errorf("no install bundle (%w): run `make build-installer` or `make e2e`", err)
	}
	if err := step("cluster up", func() error {
		_, err := script(nil, "hack/cluster/up.sh")
		return err
	}); err != nil {
		return fmt.Errorf("the local cluster cannot start: %w", err)
	}
	out, err := script(nil, "bash", "-c", "source hack/cluster/lib.sh && echo $bin $KUBECONFIG $NODE_IP")
	if err != nil {
		return err
	}
	fields := strings.Fields(out)
	if len(fields) != 3 {
		return fmt.Errorf("hack/cluster/lib.sh: want binary dir, kubeconfig and node IP, got %q", out)
	}
	env.kubectl, env.kubeconfig, env.nodeIP = filepath.Join(fields[0], "kubectl"), fields[1], fields[2]
	if err := step("leftovers removed", removeLeftovers); err != nil {
		return err
	}
	var tarballs string
	if err := step("images built", func() error {
		tarballs, err = script([]string{"IMG=" + env.image, "IMG_LEGACY=" + env.legacyImage}, "hack/image.sh", "release", "legacy")
		return err
	}); err != nil {
		return err
	}
	return step("images loaded", func() error {
		_, err := script(nil, append([]string{"hack/cluster/load-images.sh"}, strings.Fields(tarballs)...)...)
		return err
	})
}

// removeLeftovers uninstalls what an earlier run on the same cluster left (the suite's
// namespace first, while the operator still runs to release its finalizers), so that every run
// installs the product from scratch and runs the images it just built.
func removeLeftovers() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := kubectlErr(ctx, nil, "delete", "namespace", namespace, "--ignore-not-found", "--timeout=3m"); err != nil {
		return err
	}
	_, err := kubectlErr(ctx, nil, "delete", "-f", filepath.Join(env.root, "dist/install.yaml"), "--ignore-not-found", "--timeout=3m")
	return err
}

// step runs one set-up step and records its duration.
func step(name string, f func() error) error {
	start := time.Now()
	err := f()
	env.steps = append(env.steps, fmt.Sprintf("%s %.1fs", name, time.Since(start).Seconds()))
	fmt.Fprintf(os.Stderr, "e2e: %s in %.1fs\n", name, time.Since(start).Seconds())
	return err
}

// script runs a command in the repository root with extra environment; its stderr goes to ours,
// its stdout is returned.
func script(extraEnv []string, argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = env.root
	cmd.Env = append(os.Environ(), extraEnv...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// kubectl runs kubectl against the cluster and returns its output; it fails the test on error.
func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := kubectlErr(t.Context(), nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kubectlErr runs kubectl with optional stdin and returns its output or an error with stderr.
func kubectlErr(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, env.kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.kubeconfig)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
