// Package plugin is the kubectl plugin `kubectl seqinbox`: it reads what the operator and the
// consumers report through the API server and requests actions the Kubernetes way. Each command
// gathers what it shows into a plain struct and renders it, so that `-o json|yaml` prints the
// same data as the text screen.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/version"
)

// DisplayName is how kubectl users call the plugin, and how its help and errors name it.
const DisplayName = "kubectl seqinbox"

// CompletionBinary is the name under which kubectl (1.26 and later) runs a plugin's completion:
// a link of that name to kubectl-seqinbox on the PATH completes `kubectl seqinbox <TAB>`.
const CompletionBinary = "kubectl_complete-seqinbox"

// Args are the command line of the process whose program is argv0: called as CompletionBinary,
// a completion request.
func Args(argv0 string, args []string) []string {
	if filepath.Base(argv0) == CompletionBinary {
		return append([]string{cobra.ShellCompRequestCmd}, args...)
	}
	return args
}

// NewRootCommand builds the plugin's command tree on streams, with kubectl's connection flags
// (-n, --context, --kubeconfig, ...) for every command.
func NewRootCommand(streams genericiooptions.IOStreams) *cobra.Command {
	return newRootCommand(streams, time.Now)
}

// newRootCommand is NewRootCommand with the clock that the ages of the screens are measured by.
func newRootCommand(streams genericiooptions.IOStreams, now func() time.Time) *cobra.Command {
	e := &env{flags: genericclioptions.NewConfigFlags(true), streams: streams, now: now}
	root := &cobra.Command{
		Use:   "kubectl-seqinbox",
		Short: "Look at and act on seqinbox inboxes (SequentialInbox) from kubectl",
		Long: `kubectl seqinbox shows a SequentialInbox on one screen (conditions that need attention, the
rollout, the consumer pods with their partitions, lag and blocked record, waiting messages, dead
letters and recent events), shows one sequence instance and what its waiting messages wait for,
requests operator actions on messages and sequence instances and waits for their outcome,
approves a Supervised rollout, and collects a support report.

It talks to the API server only, with your kubeconfig and the usual kubectl flags; what needs
the inbox's database runs in the cluster with the inbox's own credentials.`,
		Example: `  # The state of an inbox on one screen
  kubectl seqinbox status order-inbox -n shop

  # What order 42 waits for, read in a consumer pod
  kubectl seqinbox inspect order-inbox --context-id 42

  # Deliver a stuck message now, and wait for the outcome
  kubectl seqinbox consume order-inbox OrderPaid/order-42-paid

  # Approve a Supervised rollout
  kubectl seqinbox approve order-inbox`,
		Version:       version.Version,
		SilenceErrors: true,
		SilenceUsage:  true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: DisplayName},
	}
	cli.GroupCommand(root)
	root.SetVersionTemplate("{{.DisplayName}} " + version.Version + " (commit " + version.Commit + ")\n")
	root.SetIn(streams.In)
	e.flags.AddFlags(root.PersistentFlags())
	_ = root.RegisterFlagCompletionFunc("namespace", e.completeNamespaces)
	_ = root.RegisterFlagCompletionFunc("context", e.completeContexts)
	root.AddCommand(
		newStatusCommand(e),
		newInspectCommand(e),
		newActionCommand(e, v1alpha1.ActionConsume),
		newActionCommand(e, v1alpha1.ActionExpire),
		newActionCommand(e, v1alpha1.ActionConsumeAll),
		newActionCommand(e, v1alpha1.ActionClose),
		newApproveCommand(e),
		newDeadLettersCommand(e),
		newReportCommand(e),
	)
	return root
}

// env is what every command needs: kubectl's connection flags, the streams and the clock.
type env struct {
	flags   *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
	now     func() time.Time
}

// scheme knows the core types and this project's API.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}()

// clients are the connections a command uses, in the namespace of -n or the kubeconfig's context.
type clients struct {
	client.Client
	core      kubernetes.Interface
	namespace string
	// config is the connection itself, for the streams of pods/exec.
	config *rest.Config
}

// connect builds the clients from kubectl's flags; without any cluster configuration it says how
// to give one.
func (e *env) connect() (*clients, error) {
	raw, err := e.flags.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil, fmt.Errorf("read the kubeconfig: %w", err)
	}
	// kubectl would try http://localhost:8080; say instead what is missing.
	if len(raw.Clusters) == 0 && ptr.Deref(e.flags.APIServer, "") == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, errors.New("no Kubernetes cluster configured: pass --kubeconfig, set KUBECONFIG or create ~/.kube/config, as for kubectl")
	}
	cfg, err := e.flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("read the kubeconfig: %w", err)
	}
	ns, _, err := e.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, fmt.Errorf("namespace of the kubeconfig's context: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connect to the API server %s: %w", cfg.Host, err)
	}
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to the API server %s: %w", cfg.Host, err)
	}
	return &clients{Client: c, core: core, namespace: ns, config: cfg}, nil
}

// inbox reads the SequentialInbox name of the namespace; a missing one says how to list them.
func (c *clients) inbox(ctx context.Context, name string) (*v1alpha1.SequentialInbox, error) {
	var inbox v1alpha1.SequentialInbox
	err := c.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: name}, &inbox)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("no SequentialInbox %q in namespace %q: `kubectl get sqi -n %s` lists them, -n picks another namespace",
			name, c.namespace, c.namespace)
	case err != nil:
		return nil, fmt.Errorf("get SequentialInbox %s/%s: %w", c.namespace, name, err)
	}
	return &inbox, nil
}

// inboxArg accepts exactly one argument, the inbox's name; anything else is a usage error.
func inboxArg(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return cli.UsageErrorf("takes the name of one SequentialInbox, got %d arguments", len(args))
	}
	return nil
}

// completeInboxes completes the first argument with the names of the inboxes of the namespace.
func (e *env) completeInboxes(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := e.connect()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var list v1alpha1.SequentialInboxList
	if err := c.List(completionContext(cmd), &list, client.InNamespace(c.namespace)); err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	names := make([]string, 0, len(list.Items))
	for _, in := range list.Items {
		names = append(names, in.Name)
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

// completeNamespaces completes -n with the namespaces of the cluster.
func (e *env) completeNamespaces(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
	c, err := e.connect()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var list corev1.NamespaceList
	if err := c.List(completionContext(cmd), &list); err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	names := make([]string, 0, len(list.Items))
	for _, ns := range list.Items {
		names = append(names, ns.Name)
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

// completeContexts completes --context with the contexts of the kubeconfig.
func (e *env) completeContexts(_ *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
	cfg, err := e.flags.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	names := make([]string, 0, len(cfg.Contexts))
	for name := range cfg.Contexts {
		names = append(names, name)
	}
	slices.Sort(names)
	return names, cobra.ShellCompDirectiveNoFileComp
}

// completionContext is the command's context; completion may run without one.
func completionContext(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
