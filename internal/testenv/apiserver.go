package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// RepoRoot returns the directory of the project's go.mod, found upwards from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			bytes.Contains(data, []byte("module github.com/seqinbox/seqinbox\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("project root (go.mod of github.com/seqinbox/seqinbox) not found above the working directory")
		}
		dir = parent
	}
}

// AssetsDir returns the directory with kube-apiserver and etcd: $KUBEBUILDER_ASSETS, or the cache
// filled by hack/envtest.sh (which builds them from source the first time, about ten minutes).
func AssetsDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack", "envtest.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("provide envtest binaries with hack/envtest.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// APIServer returns an envtest environment with the project's CRDs from config/crd/bases, ready
// to Start. The caller stops it.
func APIServer() (*envtest.Environment, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	return &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
	}, nil
}
