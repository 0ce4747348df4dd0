package plugin

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestThePluginPageDocumentsEveryCommandAndFlag checks docs/kubectl-plugin.md against the command
// tree: every command shows in a `kubectl seqinbox COMMAND` line, each command with flags of its
// own has a "### `kubectl seqinbox COMMAND`" section (one section may name several commands)
// that names every flag the command shows in --help and no flag the command lacks, and the
// connection flags of kubectl that the page promises are the root's.
func TestThePluginPageDocumentsEveryCommandAndFlag(t *testing.T) {
	root, err := testenv.RepoRoot()
	must(t, err)
	data, err := os.ReadFile(filepath.Join(root, "docs", "kubectl-plugin.md"))
	must(t, err)
	page := string(data)
	sections := map[string]string{}
	var current []string
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "#") {
			current = nil
			if rest, ok := strings.CutPrefix(line, "### `kubectl seqinbox "); ok {
				for _, m := range regexp.MustCompile("`(?:kubectl seqinbox )?([a-z-]+)`").FindAllStringSubmatch("`"+rest, -1) {
					current = append(current, m[1])
				}
			}
			continue
		}
		for _, name := range current {
			sections[name] += line + "\n"
		}
	}
	documented := regexp.MustCompile("`(--?[a-z0-9-]+)`")
	tree := NewRootCommand(genericiooptions.NewTestIOStreamsDiscard())
	for _, cmd := range tree.Commands() {
		name := cmd.Name()
		if name == "help" || name == "completion" {
			continue
		}
		if !strings.Contains(page, "kubectl seqinbox "+name+" ") {
			t.Errorf("docs/kubectl-plugin.md shows no kubectl seqinbox %s line", name)
		}
		flags := map[string]*pflag.Flag{}
		cmd.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" || f.Hidden {
				return
			}
			flags["--"+f.Name] = f
			if f.Shorthand != "" {
				flags["-"+f.Shorthand] = f
			}
		})
		if len(flags) == 0 {
			continue
		}
		section, ok := sections[name]
		if !ok {
			t.Errorf("docs/kubectl-plugin.md has no section ### `kubectl seqinbox %s` for its flags", name)
			continue
		}
		names := map[string]bool{}
		for _, m := range documented.FindAllStringSubmatch(section, -1) {
			names[m[1]] = true
			if flags[m[1]] == nil {
				t.Errorf("docs/kubectl-plugin.md, kubectl seqinbox %s: names %s, which the command does not take", name, m[1])
			}
		}
		for spelling := range flags {
			if !names[spelling] {
				t.Errorf("docs/kubectl-plugin.md, kubectl seqinbox %s: does not name %s", name, spelling)
			}
		}
	}
	for _, flag := range []string{"namespace", "context", "kubeconfig", "cluster", "user", "server", "token", "as", "as-group", "request-timeout"} {
		if tree.PersistentFlags().Lookup(flag) == nil || !strings.Contains(page, "`--"+flag+"`") {
			t.Errorf("--%s: the page promises kubectl's flag, the root has it: %v", flag, tree.PersistentFlags().Lookup(flag) != nil)
		}
	}
}

// TestThePluginPageShowsTheStatusScreenAsThePluginPrintsIt checks that the screen on the page is
// the golden file of the degraded state, which the status test compares with the plugin's output.
func TestThePluginPageShowsTheStatusScreenAsThePluginPrintsIt(t *testing.T) {
	root, err := testenv.RepoRoot()
	must(t, err)
	page, err := os.ReadFile(filepath.Join(root, "docs", "kubectl-plugin.md"))
	must(t, err)
	golden, err := os.ReadFile(filepath.Join("testdata", "status", "degraded-blocked.txt"))
	must(t, err)
	_, after, ok := strings.Cut(string(page), "`internal/plugin/testdata/status/degraded-blocked.txt`):\n\n```text\n")
	shown, _, closed := strings.Cut(after, "```\n")
	if !ok || !closed || shown != string(golden) {
		t.Fatalf("docs/kubectl-plugin.md does not show testdata/status/degraded-blocked.txt as it is:\n%s", shown)
	}
}
