package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/controller"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/version"
)

// defaultImage is what spec.image defaults to: $SEQINBOX_IMAGE (set by the install bundle), else
// this release's image, so that operator, migrations and engine are one release.
func defaultImage() string {
	if image := os.Getenv(envImage); image != "" {
		return image
	}
	return "ghcr.io/seqinbox/seqinbox:" + version.Version
}

// operatorOptions are the flags of `seqinbox operator`.
type operatorOptions struct {
	serving       servingFlags
	metricsSecure bool
	enableHTTP2   bool
	leaderElect   bool
	image         string
	kubeconfig    string
	// blockedThreshold is controller.Options.BlockedThreshold.
	blockedThreshold time.Duration
	log              zap.Options
}

func newOperatorCommand() *cobra.Command {
	var opts operatorOptions
	cmd := &cobra.Command{
		Use:   "operator",
		Short: "Run the SequentialInbox controller manager",
		Long: `Run the controller manager that reconciles SequentialInbox and SequentialInboxAction resources:
it validates each inbox, renders its configuration, migrates its database with a Job, gates
rollouts between engines of different claim protocols, and runs the consumer Deployment.

It reads the cluster from --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the
in-cluster configuration of its pod.`,
		Example: `  # Run against the cluster of the current kubeconfig (make run does this)
  seqinbox operator

  # As the install bundle runs it
  seqinbox operator --leader-elect --metrics-bind-address :8443 --health-probe-bind-address :8081

  # Plain HTTP metrics for a local run, without authentication
  seqinbox operator --metrics-secure=false --metrics-bind-address :8080`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runOperator(cmd, opts)
		},
	}
	opts.serving.add(cmd.Flags(), ":8443", ":8081")
	cmd.Flags().BoolVar(&opts.metricsSecure, "metrics-secure", true, "serve metrics over HTTPS to authenticated and authorized scrapers only (GET /metrics)")
	cmd.Flags().BoolVar(&opts.enableHTTP2, "enable-http2", false, "allow HTTP/2 on the metrics endpoint (off: HTTP/2 stream resets are a denial-of-service risk)")
	cmd.Flags().BoolVar(&opts.leaderElect, "leader-elect", false, "elect one active manager among the replicas (a Lease in the operator's namespace)")
	cmd.Flags().StringVar(&opts.image, "default-image", defaultImage(), "image of consumers and Jobs when spec.image is empty (env SEQINBOX_IMAGE)")
	cmd.Flags().StringVar(&opts.kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster (default: $KUBECONFIG, ~/.kube/config, the pod's in-cluster configuration)")
	_ = cmd.MarkFlagFilename("kubeconfig")
	cmd.Flags().DurationVar(&opts.blockedThreshold, "blocked-threshold", 5*time.Minute,
		"how long a consumer may retry a record after infrastructure errors before the inbox is Degraded (PartitionBlocked)")
	addLogFlags(cmd, &opts.log)
	return cmd
}

func runOperator(cmd *cobra.Command, opts operatorOptions) error {
	cfg, err := restConfig(opts.kubeconfig)
	if err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts.log)))
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("register Kubernetes types: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("register SequentialInbox: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Cache:                         controller.CacheOptions(),
		Metrics:                       controller.MetricsServerOptions(opts.serving.metricsAddr, opts.metricsSecure, opts.enableHTTP2),
		HealthProbeBindAddress:        opts.serving.healthAddr,
		LeaderElection:                opts.leaderElect,
		LeaderElectionID:              "seqinbox-operator.inbox.seqinbox.dev",
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := controller.Setup(mgr, controller.Options{DefaultImage: opts.image, BlockedThreshold: opts.blockedThreshold}); err != nil {
		return fmt.Errorf("set up the SequentialInbox controller: %w", err)
	}
	if err := ctrlmetrics.Registry.Register(version.BuildInfo(version.Version, inbox.ClaimProtocol)); err != nil {
		return fmt.Errorf("register build info: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("readiness check: %w", err)
	}
	ctrl.Log.WithName("operator").Info("starting", "version", version.Version, "commit", version.Commit, "defaultImage", opts.image)
	if err := mgr.Start(cmd.Context()); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

// restConfig loads the cluster's configuration in kubectl's order (an explicit file, $KUBECONFIG,
// ~/.kube/config) with the pod's in-cluster configuration when no file has one, and says what to
// do when there is none. Client-side rate limiting is off, as controller-runtime sets it: the API
// server's priority and fairness limits the operator.
func restConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if clientcmd.IsEmptyConfig(err) || errors.Is(err, rest.ErrNotInCluster) {
		return nil, errors.New("no Kubernetes cluster configured: pass --kubeconfig, set KUBECONFIG, or run the operator in a pod")
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}
