package main

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/plugin"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// docCommand is one command line of a ```sh block of the documentation.
type docCommand struct {
	where string // file:line
	words []string
}

// docCommands returns the command lines of the ```sh blocks of the README and of docs/*.md, with
// continuation lines joined, comments and leading environment assignments removed.
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var cmds []docCommand
	for _, page := range testenv.DocPages(t) {
		f, err := os.Open(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		sc := bufio.NewScanner(f)
		inSh, pending, start := false, "", 0
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "```sh"):
				inSh = true
				continue
			case strings.HasPrefix(line, "```"):
				inSh = false
				continue
			case !inSh:
				continue
			}
			if pending == "" {
				start = n
			}
			if before, ok := strings.CutSuffix(line, "\\"); ok {
				pending += before + " "
				continue
			}
			line, _, _ = strings.Cut(pending+line, " #")
			pending = ""
			words := strings.Fields(line)
			for len(words) > 0 && regexp.MustCompile(`^[A-Z_]+=`).MatchString(words[0]) {
				words = words[1:]
			}
			if len(words) > 0 && !strings.HasPrefix(words[0], "#") {
				cmds = append(cmds, docCommand{where: rel + ":" + strconv.Itoa(start), words: words})
			}
		}
		_ = f.Close()
	}
	return cmds
}

// TestEveryCommandOfTheDocsIsAccepted checks each command line the README and docs/ show: a
// `seqinbox` (or `bin/seqinbox`, and with -tags dev `bin/seqinbox-dev`) line must be accepted by
// this build's command tree exactly as written (command, flags, flag values, arguments), and a
// `kubectl seqinbox` line by the plugin's; a `make` line must name a target of the Makefile, a `kubectl`
// line may only name the resources, conditions and annotation of this API, a `go test` line must
// name packages and benchmarks that exist, and `export NAME=$(script)` a script of the repository.
func TestEveryCommandOfTheDocsIsAccepted(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	resources := crdNames(t, root)
	cmds := docCommands(t)
	if len(cmds) < 10 {
		t.Fatalf("found %d command lines in the docs; the parser no longer reads them", len(cmds))
	}
	for _, c := range cmds {
		switch c.words[0] {
		case "seqinbox", "bin/seqinbox":
			if err := acceptedBySeqinbox(c.words[1:]); err != nil {
				t.Errorf("%s: %s: %v", c.where, strings.Join(c.words, " "), err)
			}
		case "bin/seqinbox-dev":
			// The development commands exist in a build with -tags dev (make test runs one).
			if len(devCommands()) == 0 {
				continue
			}
			if err := acceptedBySeqinbox(c.words[1:]); err != nil {
				t.Errorf("%s: %s: %v", c.where, strings.Join(c.words, " "), err)
			}
		case "make":
			for _, target := range c.words[1:] {
				if strings.Contains(target, "=") {
					continue // a variable of the Makefile (VERSION=v0.2.0)
				}
				if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
					t.Errorf("%s: make %s: the Makefile has no such target", c.where, target)
				}
			}
		case "kubectl":
			if len(c.words) > 1 && c.words[1] == "seqinbox" {
				// The plugin: its command tree must accept the line as written.
				if err := acceptedBy(plugin.NewRootCommand(genericiooptions.NewTestIOStreamsDiscard()), c.words[2:]); err != nil {
					t.Errorf("%s: %s: %v", c.where, strings.Join(c.words, " "), err)
				}
				continue
			}
			checkKubectl(t, c, resources)
		case "export":
			checkExport(t, c, root)
		case "go":
			checkGoTest(t, c, root)
		case "echo":
			checkKcat(t, c, root)
		default:
			t.Errorf("%s: %q: no test checks this command; show it outside a ```sh block or teach this test", c.where, strings.Join(c.words, " "))
		}
	}
}

// checkKcat accepts `echo 'VALUE' | kcat -P -b BROKER -t TOPIC -k KEY -H name=value ...` when the
// record it writes is one that a consumer of the sample inbox decodes as a sequenced message of a
// topic the sample reads.
func checkKcat(t *testing.T, c docCommand, root string) {
	t.Helper()
	line := strings.Join(c.words, " ")
	pipe := slices.Index(c.words, "|")
	if pipe != 2 || len(c.words) < 4 || c.words[3] != "kcat" || !slices.Contains(c.words, "-P") {
		t.Errorf("%s: %s: only echo 'VALUE' | kcat -P ... is checked", c.where, line)
		return
	}
	rec := &kgo.Record{Value: []byte(strings.Trim(c.words[1], "'"))}
	args := c.words[4:]
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-t":
			rec.Topic = args[i+1]
		case "-k":
			rec.Key = []byte(args[i+1])
		case "-H":
			name, value, _ := strings.Cut(args[i+1], "=")
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: name, Value: []byte(value)})
		}
	}
	inbox, err := manifest.Load(filepath.Join(root, "config", "samples", "inbox_v1alpha1_sequentialinbox.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	set, errs := declaration.Compile(&inbox.Spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	decoder, err := decode.New(set)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(inbox.Spec.Kafka.Topics, rec.Topic) {
		t.Errorf("%s: %s: topic %q is not one the sample reads (%v)", c.where, line, rec.Topic, inbox.Spec.Kafka.Topics)
	}
	if decoded, err := decoder.Decode(rec, time.Now()); err != nil || !decoded.Sequenced {
		t.Errorf("%s: %s: the sample inbox does not sequence this record (sequenced %v): %v", c.where, line, decoded.Sequenced, err)
	}
}

// checkExport accepts `export NAME=$(script)` where the script is a file of the repository.
func checkExport(t *testing.T, c docCommand, root string) {
	t.Helper()
	m := regexp.MustCompile(`^[A-Z_]+=\$\(([^)\s]+)\)$`).FindStringSubmatch(strings.Join(c.words[1:], " "))
	if m == nil {
		t.Errorf("%s: %s: only export NAME=$(script) is checked", c.where, strings.Join(c.words, " "))
		return
	}
	if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
		t.Errorf("%s: %s: %v", c.where, strings.Join(c.words, " "), err)
	}
}

// checkGoTest accepts `go test` lines whose packages exist and whose -bench pattern names a
// benchmark of them, and `go build` lines of ./cmd/seqinbox.
func checkGoTest(t *testing.T, c docCommand, root string) {
	t.Helper()
	line := strings.Join(c.words, " ")
	if len(c.words) >= 2 && c.words[1] == "build" {
		if c.words[len(c.words)-1] != "./cmd/seqinbox" {
			t.Errorf("%s: %s: only go build of ./cmd/seqinbox is checked", c.where, line)
		}
		return
	}
	if len(c.words) < 2 || c.words[1] != "test" {
		t.Errorf("%s: %s: only go test and go build are checked", c.where, line)
		return
	}
	var pkgs []string
	bench := ""
	for i, w := range c.words {
		switch {
		case strings.HasPrefix(w, "./"):
			pkgs = append(pkgs, strings.TrimSuffix(strings.TrimSuffix(w, "..."), "/"))
		case w == "-bench" && i+1 < len(c.words):
			bench = strings.Trim(c.words[i+1], "'\"")
		}
	}
	if len(pkgs) == 0 {
		t.Errorf("%s: %s: names no package", c.where, line)
	}
	for _, pkg := range pkgs {
		tests, err := filepath.Glob(filepath.Join(root, pkg, "*_test.go"))
		if err != nil || len(tests) == 0 {
			t.Errorf("%s: %s: package %s has no tests", c.where, line, pkg)
			continue
		}
		if bench == "" {
			continue
		}
		top, _, _ := strings.Cut(bench, "/")
		re, err := regexp.Compile(top)
		if err != nil {
			t.Errorf("%s: %s: -bench %q: %v", c.where, line, bench, err)
			continue
		}
		found := false
		for _, f := range tests {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range regexp.MustCompile(`(?m)^func (Benchmark\w*)\(`).FindAllStringSubmatch(string(data), -1) {
				found = found || re.MatchString(m[1])
			}
		}
		if !found {
			t.Errorf("%s: %s: no benchmark of %s matches %q", c.where, line, pkg, top)
		}
	}
}

// acceptedBySeqinbox parses args with the command tree as cobra does before running a command.
func acceptedBySeqinbox(args []string) error {
	return acceptedBy(newRootCommand(), args)
}

// acceptedBy parses args with the command tree of root as cobra does before running a command.
func acceptedBy(root *cobra.Command, args []string) error {
	root.InitDefaultCompletionCmd()
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	if !cmd.Runnable() || cmd.HasSubCommands() && cmd.Args == nil {
		return errUnrunnable
	}
	err = cmd.ParseFlags(rest)
	if errors.Is(err, pflag.ErrHelp) {
		return nil // --help is accepted by every command
	}
	if err != nil {
		return err
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return err
	}
	return cmd.ValidateRequiredFlags()
}

var errUnrunnable = cli.UsageErrorf("names a command that only groups others")

// crdNames returns every name a kubectl command may use for our resources (plural, singular, short).
func crdNames(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Names struct {
					Plural, Singular string
					ShortNames       []string `json:"shortNames"`
				}
			}
		}
		if err := yaml.Unmarshal(data, &crd); err != nil {
			t.Fatal(err)
		}
		n := crd.Spec.Names
		names = append(names, append(n.ShortNames, n.Plural, n.Singular)...)
	}
	return names
}

// checkKubectl accepts `kubectl get|describe|wait|annotate` on our resources with our conditions
// and our approval annotation.
func checkKubectl(t *testing.T, c docCommand, resources []string) {
	t.Helper()
	if len(c.words) < 3 || !slices.Contains([]string{"get", "describe", "wait", "annotate"}, c.words[1]) {
		t.Errorf("%s: %s: only kubectl get, describe, wait and annotate are checked", c.where, strings.Join(c.words, " "))
		return
	}
	conditions := []string{v1alpha1.ConditionReady, v1alpha1.ConditionConfigValid, v1alpha1.ConditionSchemaReady,
		v1alpha1.ConditionRolloutBlocked, v1alpha1.ConditionProgressing, v1alpha1.ConditionDegraded, v1alpha1.ConditionScalingLimited}
	var resource string
	for _, w := range c.words[2:] {
		if !strings.HasPrefix(w, "-") {
			resource, _, _ = strings.Cut(w, "/")
			break
		}
	}
	if !slices.Contains(resources, resource) {
		t.Errorf("%s: %s: %q is not a resource of this API (%v)", c.where, strings.Join(c.words, " "), resource, resources)
	}
	for _, w := range c.words[3:] {
		if cond, ok := strings.CutPrefix(w, "--for=condition="); ok && !slices.Contains(conditions, cond) {
			t.Errorf("%s: waits for condition %s, which the API does not define", c.where, cond)
		}
		if key, _, ok := strings.Cut(w, "="); ok && strings.HasPrefix(key, "inbox.seqinbox.dev/") && key != v1alpha1.ApproveRolloutAnnotation {
			t.Errorf("%s: annotation %s is not %s", c.where, key, v1alpha1.ApproveRolloutAnnotation)
		}
	}
}

// cliSections returns the text of each "### `seqinbox COMMAND`" section of docs/cli.md by the
// command's path ("deadletters retry").
func cliSections(t *testing.T) map[string]string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	current := ""
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "#") {
			current = ""
			if name, ok := strings.CutPrefix(line, "### `seqinbox "); ok {
				current = strings.TrimSuffix(name, "`")
			}
			continue
		}
		if current != "" {
			sections[current] += line + "\n"
		}
	}
	return sections
}

// TestTheCLIPageDocumentsEveryFlagOfEachCommand checks docs/cli.md against the command tree: each
// command with flags has its section, the section names every flag the command shows in --help
// and no flag that the command lacks, and the row of a flag that an environment variable stands
// in for names that variable.
func TestTheCLIPageDocumentsEveryFlagOfEachCommand(t *testing.T) {
	sections := cliSections(t)
	documented := regexp.MustCompile("`(--?[a-z0-9-]+)`")
	envOfFlag := regexp.MustCompile(`\(env (SEQINBOX_[A-Z_]+)\)`)
	seen := map[string]bool{}
	for _, path := range commandPaths(newRootCommand(), nil) {
		cmd, _, err := newRootCommand().Find(path)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.Join(path, " ")
		flags := map[string]*pflag.Flag{}
		shown := 0
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			flags["--"+f.Name] = f
			if f.Shorthand != "" {
				flags["-"+f.Shorthand] = f
			}
			if !f.Hidden {
				shown++
			}
		})
		if shown == 0 {
			continue
		}
		section, ok := sections[name]
		if !ok {
			t.Errorf("docs/cli.md has no section ### `seqinbox %s` for its %d flags", name, shown)
			continue
		}
		seen[name] = true
		names := map[string]bool{}
		for _, m := range documented.FindAllStringSubmatch(section, -1) {
			names[m[1]] = true
			if flags[m[1]] == nil {
				t.Errorf("docs/cli.md, seqinbox %s: names %s, which the command does not take", name, m[1])
			}
		}
		for spelling, f := range flags {
			if f.Hidden {
				continue
			}
			if !names[spelling] {
				t.Errorf("docs/cli.md, seqinbox %s: does not name %s", name, spelling)
			}
			env := envOfFlag.FindStringSubmatch(f.Usage)
			if env == nil || !strings.HasPrefix(spelling, "--") {
				continue
			}
			for _, row := range strings.Split(section, "\n") {
				if strings.HasPrefix(row, "| `"+spelling+"`") && !strings.Contains(row, "`"+env[1]+"`") {
					t.Errorf("docs/cli.md, seqinbox %s: the row of %s does not name %s, which stands in for it", name, spelling, env[1])
				}
			}
		}
	}
	for name, section := range sections {
		// A development command exists only in a build with -tags dev; make test runs both builds.
		if !seen[name] && !strings.Contains(section, "A development command") {
			t.Errorf("docs/cli.md has a section for seqinbox %s, which is no command with flags", name)
		}
	}
}
