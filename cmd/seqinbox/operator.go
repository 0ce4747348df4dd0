package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/controller"
	"github.com/seqinbox/seqinbox/internal/version"
)

func init() {
	commands["operator"] = command{summary: "run the SequentialInbox controller manager", run: runOperator}
}

// defaultImage is what spec.image defaults to: $SEQINBOX_IMAGE (set by the install bundle), else
// this release's image, so that operator, migrations and engine are one release.
func defaultImage() string {
	if image := os.Getenv("SEQINBOX_IMAGE"); image != "" {
		return image
	}
	return "ghcr.io/seqinbox/seqinbox:" + version.Version
}

func runOperator(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	metricsAddr := fs.String("metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint; 0 disables it")
	probeAddr := fs.String("health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
	leaderElect := fs.Bool("leader-elect", false, "elect one active manager among the replicas (a Lease in the operator's namespace)")
	image := fs.String("default-image", defaultImage(), "image of consumers and Jobs when spec.image is empty (env SEQINBOX_IMAGE)")
	logOpts := zap.Options{}
	logOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&logOpts)))

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("register Kubernetes types: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("register SequentialInbox: %w", err)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Cache:                         controller.CacheOptions(),
		Metrics:                       metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:        *probeAddr,
		LeaderElection:                *leaderElect,
		LeaderElectionID:              "seqinbox-operator.inbox.seqinbox.dev",
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := controller.Setup(mgr, controller.Options{DefaultImage: *image}); err != nil {
		return fmt.Errorf("set up the SequentialInbox controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("readiness check: %w", err)
	}
	ctrl.Log.WithName("operator").Info("starting", "version", version.Version, "commit", version.Commit, "defaultImage", *image)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}
