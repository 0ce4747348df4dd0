package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/cli"
)

// Where the operator puts things in a consumer pod (internal/controller/workload.go and
// config.go): the command lines run in the pod name them.
const (
	// consumerContainer is the container of a consumer pod that runs seqinbox.
	consumerContainer = "consumer"
	// podBinary is the seqinbox binary of the inbox's image.
	podBinary = "/seqinbox"
	// podManifest is the inbox's rendered manifest in the pod, for `-f`; the pod's environment
	// holds the Secret-held settings (database URL, Kafka credentials) that the manifest leaves out.
	podManifest = "/etc/seqinbox/inbox.yaml"
	// engineVersionAnnotation is the engine version of a consumer pod's image.
	engineVersionAnnotation = "inbox.seqinbox.dev/engine-version"
)

// maxHeldStderr is how much of a pod command's stderr is held back until it exits, so that the
// error of an image without the command can replace it; beyond, the rest streams as it comes.
const maxHeldStderr = 64 << 10

// podCommand is a seqinbox command line to run in a consumer pod with the pod's credentials.
type podCommand struct {
	// Args follow the binary: {"deadletters", "list", "-f", podManifest}.
	Args []string
	// Since is the first release whose image has the command: an older image is named with it.
	Since string
}

// name is the command as a person calls it: "seqinbox deadletters list".
func (p podCommand) name() string {
	words := []string{"seqinbox"}
	for _, a := range p.Args {
		if strings.HasPrefix(a, "-") {
			break
		}
		words = append(words, a)
	}
	return strings.Join(words, " ")
}

// execInConsumer runs `seqinbox ARGS` in the newest ready consumer pod of inbox through the
// pods/exec subresource (WebSocket, SPDY when the API server speaks no WebSocket, as kubectl
// does), so that the inbox's own image and credentials do the work and no Secret leaves the
// cluster. The command's stdout streams to stdout, its stderr to stderr; it returns the command's
// exit code. An error says what kept the command from running: no ready consumer pod, no right to
// create pods/exec, an image without the command.
func execInConsumer(ctx context.Context, c *clients, inbox *v1alpha1.SequentialInbox, cmd podCommand, stdout, stderr io.Writer) (int, error) {
	pod, err := readyConsumerPod(ctx, c, inbox)
	if err != nil {
		return 0, err
	}
	if err := checkEngineHas(pod, cmd); err != nil {
		return 0, err
	}
	exec, err := c.executor(pod, cmd)
	if err != nil {
		return 0, err
	}
	held := &heldWriter{w: stderr, limit: maxHeldStderr}
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: held})
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return cli.ExitOK, held.flush()
	case errors.As(err, &exit) && exit.Exited():
		if exit.ExitStatus() == cli.ExitUsage && lacksCommand(held.buf.String()) {
			return 0, olderImageError(pod, cmd, firstLine(held.buf.String()))
		}
		return exit.ExitStatus(), held.flush()
	}
	_ = held.flush()
	if denied, sarErr := c.execDenied(ctx, pod); sarErr == nil && denied != "" {
		return 0, errors.New(denied)
	}
	return 0, fmt.Errorf("run `%s` in pod %s/%s: %w", cmd.name(), pod.Namespace, pod.Name, err)
}

// readyConsumerPod returns the inbox's newest ready consumer pod (during a rollout the newest
// runs the newest image), or says why there is none.
func readyConsumerPod(ctx context.Context, c *clients, inbox *v1alpha1.SequentialInbox) (*corev1.Pod, error) {
	pods, err := consumerPods(ctx, c, inbox)
	if err != nil {
		return nil, err
	}
	pod := newestReady(pods)
	if pod == nil {
		ready, reason := "<none>", "<none>"
		if c := meta.FindStatusCondition(inbox.Status.Conditions, v1alpha1.ConditionReady); c != nil {
			ready, reason = string(c.Status), c.Reason
		}
		return nil, fmt.Errorf("SequentialInbox %s/%s has no ready consumer pod (of %d) to run the command in; `kubectl get sqi %s -n %s` shows READY %s, REASON %s, REPLICAS %d, "+
			"and `kubectl seqinbox status %s -n %s` shows why",
			inbox.Namespace, inbox.Name, len(pods), inbox.Name, inbox.Namespace, ready, reason, inbox.Status.ReplicasReady, inbox.Name, inbox.Namespace)
	}
	return pod, nil
}

// newestReady is the ready pod created last (by name when created in the same second); nil
// when none is ready.
func newestReady(pods []corev1.Pod) *corev1.Pod {
	var newest *corev1.Pod
	for i := range pods {
		p := &pods[i]
		if !podReady(p) {
			continue
		}
		if newest == nil || p.CreationTimestamp.After(newest.CreationTimestamp.Time) ||
			p.CreationTimestamp.Equal(&newest.CreationTimestamp) && p.Name < newest.Name {
			newest = p
		}
	}
	return newest
}

// podReady reports whether pod runs, is not terminating, has the consumer container and passed
// its readiness probe (schema check and version fence).
func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil || consumerImage(pod) == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// consumerImage is the image of the pod's consumer container; empty without one.
func consumerImage(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		if c.Name == consumerContainer {
			return c.Image
		}
	}
	return ""
}

// checkEngineHas refuses, before anything runs, a pod whose engine is a release before the
// command's; a version that is no release number (a build of the source) is let through and
// judged by the answer of its binary.
func checkEngineHas(pod *corev1.Pod, cmd podCommand) error {
	have, err := utilversion.ParseSemantic(pod.Annotations[engineVersionAnnotation])
	if err != nil || cmd.Since == "" {
		return nil
	}
	release := utilversion.MajorMinor(have.Major(), have.Minor()).WithPatch(have.Patch())
	if release.LessThan(utilversion.MustParseSemantic(cmd.Since)) {
		return olderImageError(pod, cmd, "")
	}
	return nil
}

// lacksCommand reports whether the stderr of a usage error (exit 2) says that the binary knows
// no such command or flag: the image is older than the plugin.
func lacksCommand(stderr string) bool {
	return strings.Contains(stderr, "unknown command") || strings.Contains(stderr, "unknown flag") ||
		strings.Contains(stderr, "unknown shorthand flag")
}

// olderImageError names the image that lacks the command and the release that has it.
func olderImageError(pod *corev1.Pod, cmd podCommand, answer string) error {
	version := pod.Annotations[engineVersionAnnotation]
	if version == "" {
		version = "unknown version"
	}
	msg := fmt.Sprintf("consumer pod %s/%s runs image %s (seqinbox %s), which lacks `%s`", pod.Namespace, pod.Name, consumerImage(pod), version, cmd.name())
	if answer != "" {
		msg += " (it answered: " + answer + ")"
	}
	return fmt.Errorf("%s: this needs an image of seqinbox %s or later; update spec.image of the SequentialInbox, or use a kubectl seqinbox of the image's release", msg, cmd.Since)
}

// firstLine is the first line of s without surrounding space.
func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// executor streams a command in the pod's consumer container over WebSocket, and over SPDY when
// the upgrade to WebSocket fails, as kubectl does: an API server before Kubernetes 1.30 speaks no
// WebSocket exec, and one before 1.35 authorizes the WebSocket's GET with the verb get, which a
// Role that grants exec the traditional way (create on pods/exec) lacks while SPDY's POST passes.
func (c *clients) executor(pod *corev1.Pod, cmd podCommand) (remotecommand.Executor, error) {
	u := c.core.CoreV1().RESTClient().Post().Namespace(pod.Namespace).Resource("pods").Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: consumerContainer,
			Command:   append([]string{podBinary}, cmd.Args...),
			Stdout:    true,
			Stderr:    true,
		}, clientgoscheme.ParameterCodec).URL()
	spdy, err := remotecommand.NewSPDYExecutor(c.config, "POST", u)
	if err != nil {
		return nil, fmt.Errorf("exec in pod %s/%s over SPDY: %w", pod.Namespace, pod.Name, err)
	}
	// A WebSocket upgrade is a GET (RFC 6455 4.1).
	ws, err := remotecommand.NewWebSocketExecutor(c.config, "GET", u.String())
	if err != nil {
		return nil, fmt.Errorf("exec in pod %s/%s over WebSocket: %w", pod.Namespace, pod.Name, err)
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// execDenied asks the API server whether the user may create pods/exec on pod; when not, it
// returns the error that says which right is missing.
func (c *clients) execDenied(ctx context.Context, pod *corev1.Pod) (string, error) {
	review, err := c.core.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: pod.Namespace, Verb: "create", Resource: "pods", Subresource: "exec", Name: pod.Name,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	if review.Status.Allowed {
		return "", nil
	}
	return fmt.Sprintf("you may not run commands in the consumer pod %s/%s: this needs the RBAC verb create on pods/exec in namespace %s (a Role rule with "+
		"resources [pods/exec], verbs [create]); the command then runs with the pod's own credentials, and no Secret leaves the cluster", pod.Namespace, pod.Name, pod.Namespace), nil
}

// heldWriter holds what is written up to limit bytes and then passes everything through to w.
type heldWriter struct {
	w       io.Writer
	limit   int
	buf     bytes.Buffer
	through bool
}

func (h *heldWriter) Write(p []byte) (int, error) {
	if h.through {
		return h.w.Write(p)
	}
	h.buf.Write(p)
	if h.buf.Len() > h.limit {
		if err := h.flush(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// flush writes what is held and lets the rest through.
func (h *heldWriter) flush() error {
	h.through = true
	_, err := h.w.Write(h.buf.Bytes())
	h.buf.Reset()
	return err
}
