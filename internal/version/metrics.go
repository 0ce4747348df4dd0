package version

import "github.com/prometheus/client_golang/prometheus"

// BuildInfo is the seqinbox_build_info gauge, always 1, labelled with the release, the commit and
// the claim protocol of the running binary: dashboards and alerts join on it to show which
// release runs where, and a mixed rollout is visible as two label sets.
func BuildInfo(version, claimProtocol string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "seqinbox_build_info",
		Help:        "1, labelled with the version, commit and claim protocol of the running seqinbox binary.",
		ConstLabels: prometheus.Labels{"version": version, "commit": Commit, "claim_protocol": claimProtocol},
	})
	g.Set(1)
	return g
}
