package controller

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// MetricsServerOptions serve the operator's metrics the way kubebuilder v4 scaffolds them. Secure:
// HTTPS (a self-signed certificate; scrapers skip its verification or terminate elsewhere), and
// every request authenticated with a TokenReview and authorized with a SubjectAccessReview for
// GET /metrics (the metrics-reader role). Insecure serves plain HTTP for local runs. HTTP/2 stays
// off unless enabled: its stream resets made servers deny service (CVE-2023-44487, CVE-2023-39325).
func MetricsServerOptions(addr string, secure, enableHTTP2 bool) metricsserver.Options {
	opts := metricsserver.Options{BindAddress: addr, SecureServing: secure}
	if !enableHTTP2 {
		opts.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	if secure {
		opts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return opts
}
