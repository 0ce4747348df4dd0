package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestEveryBuildOfTheBinaryTrimsPaths checks each command of the Makefile, the Dockerfile and the
// scripts of hack/ that builds or runs ./cmd/seqinbox: it passes -trimpath, so that no binary
// carries the file system paths of the machine that built it.
func TestEveryBuildOfTheBinaryTrimsPaths(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "hack", "*.sh"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "Makefile"), filepath.Join(root, "Dockerfile"))
	builds := 0
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		command := ""
		for n, line := range strings.Split(string(data), "\n") {
			command += line
			if strings.HasSuffix(line, "\\") {
				continue
			}
			if (strings.Contains(command, "go build") || strings.Contains(command, "go run")) && strings.Contains(command, "./cmd/seqinbox") {
				builds++
				if !strings.Contains(command, "-trimpath") {
					t.Errorf("%s:%d builds ./cmd/seqinbox without -trimpath: %s", rel, n+1, command)
				}
			}
			command = ""
		}
	}
	if builds < 3 {
		t.Fatalf("found %d builds of ./cmd/seqinbox; the test no longer reads the build commands", builds)
	}
}
