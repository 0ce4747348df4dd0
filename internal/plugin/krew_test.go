package plugin

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestTheKrewManifestIsAPluginOfThisBinaryOnceTheReleaseFillsItIn fills in the placeholders of
// plugins/krew/seqinbox.yaml that hack/krew.sh fills (and only those), and checks the result as
// krew reads it: a Plugin named seqinbox of the release's version, whose every platform names an
// archive of that version at the release URL, its SHA-256, and the binary kubectl-seqinbox.
func TestTheKrewManifestIsAPluginOfThisBinaryOnceTheReleaseFillsItIn(t *testing.T) {
	root, err := testenv.RepoRoot()
	must(t, err)
	template, err := os.ReadFile(filepath.Join(root, "plugins", "krew", "seqinbox.yaml"))
	must(t, err)
	script, err := os.ReadFile(filepath.Join(root, "hack", "krew.sh"))
	must(t, err)
	placeholder := regexp.MustCompile(`@[A-Z0-9_]+@`)
	const version, url, sum = "v9.8.7", "https://releases.example/v9.8.7", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	filled := strings.NewReplacer("@VERSION@", version, "@URL@", url).Replace(string(template))
	// hack/krew.sh fills SHA256_<OS>_<ARCH> for each platform it builds.
	built := regexp.MustCompile(`for platform in ([^;]+);`).FindSubmatch(script)
	if built == nil {
		t.Fatal("hack/krew.sh no longer lists its platforms as the test reads them")
	}
	var platforms []string
	for _, p := range strings.Fields(string(built[1])) {
		platforms = append(platforms, strings.ReplaceAll(p, "/", "_"))
		filled = strings.ReplaceAll(filled, "@SHA256_"+strings.ToUpper(strings.ReplaceAll(p, "/", "_"))+"@", sum)
	}
	if left := placeholder.FindAllString(filled, -1); len(left) > 0 {
		t.Fatalf("placeholders hack/krew.sh does not fill: %v", left)
	}
	var m struct {
		APIVersion, Kind string
		Metadata         struct{ Name string }
		Spec             struct {
			Version, Homepage, ShortDescription, Description string
			Platforms                                        []struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				}
				URI, Sha256, Bin string
				Files            []struct{ From, To string }
			}
		}
	}
	must(t, yaml.UnmarshalStrict([]byte(filled), &m))
	if m.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || m.Kind != "Plugin" || m.Metadata.Name != "seqinbox" || m.Spec.Version != version {
		t.Fatalf("manifest %+v", m)
	}
	var covered []string
	for _, p := range m.Spec.Platforms {
		os, arch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		covered = append(covered, os+"_"+arch)
		if p.URI != url+"/kubectl-seqinbox_"+version+"_"+os+"_"+arch+".tar.gz" || p.Sha256 != sum || p.Bin != "kubectl-seqinbox" ||
			len(p.Files) != 1 || p.Files[0].From != "kubectl-seqinbox" {
			t.Errorf("platform %s/%s: %+v", os, arch, p)
		}
	}
	slices.Sort(covered)
	slices.Sort(platforms)
	if !slices.Equal(covered, platforms) {
		t.Errorf("the manifest's platforms %v are not the ones hack/krew.sh builds %v", covered, platforms)
	}
}
