package plugin

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/version"
)

// redacted stands in for every Secret value in a report.
const redacted = "[REDACTED]"

// minScrubbed is the shortest Secret value that is searched for and replaced in a report's
// files: shorter ones ("1", "true") would mangle the text and say nothing about the Secret.
const minScrubbed = 6

// operatorLabels select the operator's pods in its namespace (the install bundle's label).
var operatorLabels = map[string]string{"control-plane": "controller-manager"}

// reportOptions are the flags of `kubectl seqinbox report`.
type reportOptions struct {
	file              string
	operatorNamespace string
	since             time.Duration
	tail              int64
}

func newReportCommand(e *env) *cobra.Command {
	var o reportOptions
	cmd := &cobra.Command{
		Use:   "report NAME",
		Short: "Write a support report of an inbox as one archive",
		Long: `Write a support report of a SequentialInbox as one .tar.gz archive: the inbox and its status
screen, its actions, the objects the operator made for it (Deployment, ReplicaSets, pods, Jobs,
ConfigMaps, Services, PodDisruptionBudgets), the events of all of them, the logs of the consumer
pods, of the Job pods and of the operator.

No Secret value goes into the archive: the Secrets the inbox's pods use are listed with their
keys only, and every value of them (and the password of a URL among them) is replaced by
[REDACTED] wherever it appears, in logs too. What could not be collected (a log of a pod that
has not started, a namespace you may not read) is named in README.txt, and the rest is written.`,
		Example: `  kubectl seqinbox report order-inbox
  kubectl seqinbox report order-inbox -n shop --file /tmp/order-inbox.tar.gz --since 6h`,
		Args:              inboxArg,
		ValidArgsFunction: e.completeInboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.connect()
			if err != nil {
				return err
			}
			now := e.now()
			file := o.file
			if file == "" {
				file = fmt.Sprintf("seqinbox-report-%s-%s.tar.gz", args[0], now.UTC().Format("20060102T150405Z"))
			}
			r, err := collectReport(cmd.Context(), c, args[0], o, now)
			if err != nil {
				return err
			}
			n, err := r.write(file)
			if err != nil {
				return err
			}
			_, _ = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d files, %d bytes; %d item(s) could not be collected (README.txt names them)\n",
				file, len(r.files), n, len(r.missing))
			return nil
		},
	}
	cmd.Flags().StringVarP(&o.file, "file", "f", "", "the archive to write (default: seqinbox-report-NAME-TIME.tar.gz in the current directory)")
	cmd.Flags().StringVar(&o.operatorNamespace, "operator-namespace", "seqinbox-system", "the namespace of the operator, whose logs the report holds")
	cmd.Flags().DurationVar(&o.since, "since", 24*time.Hour, "only log lines newer than this")
	cmd.Flags().Int64Var(&o.tail, "tail", 10000, "at most this many of the latest log lines per container")
	_ = cmd.MarkFlagFilename("file", "tar.gz", "tgz")
	return cmd
}

// report is the archive's content before it is written: files by path, and what is missing.
type report struct {
	dir     string
	files   map[string][]byte
	missing []string
	// secrets are the values replaced by redacted in every file.
	secrets []string
}

// add stores a file of the report.
func (r *report) add(name string, data []byte) { r.files[path.Join(r.dir, name)] = data }

// addYAML stores objects as one YAML list (their kinds set, managed fields left out).
func (r *report) addYAML(name string, objs ...client.Object) {
	docs := make([]any, 0, len(objs))
	for _, obj := range objs {
		obj = obj.DeepCopyObject().(client.Object)
		if gvk, err := apiutil.GVKForObject(obj, scheme); err == nil {
			obj.GetObjectKind().SetGroupVersionKind(gvk)
		}
		obj.SetManagedFields(nil)
		docs = append(docs, obj)
	}
	b, err := yaml.Marshal(map[string]any{"items": docs})
	if err != nil {
		r.miss("%s: %v", name, err)
		return
	}
	r.add(name, b)
}

// miss records what could not be collected, for README.txt.
func (r *report) miss(format string, args ...any) {
	r.missing = append(r.missing, fmt.Sprintf(format, args...))
}

// collectReport gathers the report of the inbox name.
func collectReport(ctx context.Context, c *clients, name string, o reportOptions, now time.Time) (*report, error) {
	inbox, err := c.inbox(ctx, name)
	if err != nil {
		return nil, err
	}
	r := &report{dir: fmt.Sprintf("seqinbox-report-%s-%s", name, now.UTC().Format("20060102T150405Z")), files: map[string][]byte{}}
	r.addYAML("inbox.yaml", inbox)

	st, err := gatherStatus(ctx, c, name, now)
	if err != nil {
		return nil, err
	}
	var screenText bytes.Buffer
	renderStatus(&screenText, screen{}, st)
	r.add("status.txt", screenText.Bytes())
	if b, err := yaml.Marshal(st); err == nil {
		r.add("status.yaml", b)
	}

	ns := client.InNamespace(inbox.Namespace)
	var actions v1alpha1.SequentialInboxActionList
	var actionObjs []client.Object
	owners := map[types.UID]bool{inbox.UID: true}
	if err := c.List(ctx, &actions, ns); err != nil {
		r.miss("actions: %v", err)
	}
	for i := range actions.Items {
		if a := &actions.Items[i]; a.Spec.InboxName == inbox.Name {
			actionObjs = append(actionObjs, a)
			owners[a.UID] = true
		}
	}
	r.addYAML("actions.yaml", actionObjs...)

	// The objects the operator made for the inbox and its actions, found by their owner.
	owned := func(obj client.Object) bool {
		return slices.ContainsFunc(obj.GetOwnerReferences(), func(ref metav1.OwnerReference) bool { return owners[ref.UID] })
	}
	var deployments appsv1.DeploymentList
	var jobs batchv1.JobList
	var configMaps corev1.ConfigMapList
	var services corev1.ServiceList
	var pdbs policyv1.PodDisruptionBudgetList
	var replicaSets appsv1.ReplicaSetList
	var pods corev1.PodList
	var secretList corev1.SecretList
	lists := []struct {
		file string
		list client.ObjectList
	}{{"deployments.yaml", &deployments}, {"jobs.yaml", &jobs}, {"configmaps.yaml", &configMaps},
		{"services.yaml", &services}, {"poddisruptionbudgets.yaml", &pdbs}}
	for _, l := range lists {
		if err := c.List(ctx, l.list, ns); err != nil {
			r.miss("%s: %v", l.file, err)
			continue
		}
		var items []client.Object
		_ = forEachItem(l.list, func(obj client.Object) {
			if owned(obj) {
				items = append(items, obj)
				owners[obj.GetUID()] = true
			}
		})
		r.addYAML("objects/"+l.file, items...)
	}
	for _, l := range []struct {
		file string
		list client.ObjectList
	}{{"replicasets.yaml", &replicaSets}, {"pods.yaml", &pods}} {
		if err := c.List(ctx, l.list, ns); err != nil {
			r.miss("%s: %v", l.file, err)
			continue
		}
		var items []client.Object
		_ = forEachItem(l.list, func(obj client.Object) {
			if owned(obj) || isConsumerOf(obj, inbox) || ownedJobPod(obj, jobs.Items, owners) {
				items = append(items, obj)
				owners[obj.GetUID()] = true
			}
		})
		r.addYAML("objects/"+l.file, items...)
	}
	reportPods := podsOf(pods.Items, owners)

	// Secrets: the ones the inbox owns and the ones its pods read, with their keys only.
	secretNames := map[string]bool{}
	if err := c.List(ctx, &secretList, ns); err != nil {
		r.miss("secrets (their keys and the values to redact): %v", err)
	}
	for i := range secretList.Items {
		if owned(&secretList.Items[i]) {
			secretNames[secretList.Items[i].Name] = true
		}
	}
	specs := []corev1.PodSpec{}
	for _, p := range reportPods {
		specs = append(specs, p.Spec)
	}
	for _, d := range deployments.Items {
		if owners[d.UID] {
			specs = append(specs, d.Spec.Template.Spec)
		}
	}
	for _, j := range jobs.Items {
		if owners[j.UID] {
			specs = append(specs, j.Spec.Template.Spec)
		}
	}
	for _, spec := range specs {
		for _, n := range secretsOfPod(&spec) {
			secretNames[n] = true
		}
	}
	r.addSecrets(secretList.Items, secretNames)

	// Events of every object of the report.
	var events corev1.EventList
	if err := c.List(ctx, &events, ns); err != nil {
		r.miss("events: %v", err)
	}
	var evs []client.Object
	for i := range events.Items {
		if owners[events.Items[i].InvolvedObject.UID] {
			evs = append(evs, &events.Items[i])
		}
	}
	slices.SortStableFunc(evs, func(a, b client.Object) int {
		return eventTime(a.(*corev1.Event)).Compare(eventTime(b.(*corev1.Event)).Time)
	})
	r.addYAML("events.yaml", evs...)

	for _, p := range reportPods {
		r.addLogs(ctx, c, "logs/"+inbox.Namespace, p, o)
	}
	var operatorPods corev1.PodList
	if err := c.List(ctx, &operatorPods, client.InNamespace(o.operatorNamespace), client.MatchingLabels(operatorLabels)); err != nil {
		r.miss("operator pods in namespace %s: %v", o.operatorNamespace, err)
	} else if len(operatorPods.Items) == 0 {
		r.miss("operator logs: no pod with label %s in namespace %s (--operator-namespace names another)", labels.Set(operatorLabels), o.operatorNamespace)
	}
	for i := range operatorPods.Items {
		r.addLogs(ctx, c, "logs/"+o.operatorNamespace, &operatorPods.Items[i], o)
	}
	r.add("README.txt", r.readme(inbox, now))
	return r, nil
}

// forEachItem calls fn for each item of a typed list.
func forEachItem(list client.ObjectList, fn func(client.Object)) error {
	items, err := meta.ExtractList(list)
	for _, it := range items {
		if obj, ok := it.(client.Object); ok {
			fn(obj)
		}
	}
	return err
}

// isConsumerOf reports whether the pod is one of the inbox's consumers (its status's selector).
func isConsumerOf(obj client.Object, inbox *v1alpha1.SequentialInbox) bool {
	if _, ok := obj.(*corev1.Pod); !ok || inbox.Status.Selector == "" {
		return false
	}
	sel, err := labels.Parse(inbox.Status.Selector)
	return err == nil && sel.Matches(labels.Set(obj.GetLabels()))
}

// ownedJobPod reports whether the pod runs a Job of the report (the Job controller's label).
func ownedJobPod(obj client.Object, jobs []batchv1.Job, owners map[types.UID]bool) bool {
	name := obj.GetLabels()[batchv1.JobNameLabel]
	return name != "" && slices.ContainsFunc(jobs, func(j batchv1.Job) bool { return j.Name == name && owners[j.UID] })
}

// podsOf returns the pods among all whose UID the report holds.
func podsOf(all []corev1.Pod, owners map[types.UID]bool) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := range all {
		if owners[all[i].UID] {
			pods = append(pods, &all[i])
		}
	}
	return pods
}

// secretsOfPod names every Secret a pod spec reads: volumes, env and envFrom, image pull secrets.
func secretsOfPod(spec *corev1.PodSpec) []string {
	var names []string
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			names = append(names, v.Secret.SecretName)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.Secret != nil {
					names = append(names, s.Secret.Name)
				}
			}
		}
	}
	for _, ps := range spec.ImagePullSecrets {
		names = append(names, ps.Name)
	}
	for _, ctr := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, ev := range ctr.Env {
			if ev.ValueFrom != nil && ev.ValueFrom.SecretKeyRef != nil {
				names = append(names, ev.ValueFrom.SecretKeyRef.Name)
			}
		}
		for _, ef := range ctr.EnvFrom {
			if ef.SecretRef != nil {
				names = append(names, ef.SecretRef.Name)
			}
		}
	}
	return names
}

// addSecrets lists the named Secrets with their keys and no value, and remembers their values
// (and the passwords of URLs among them) to redact them everywhere else.
func (r *report) addSecrets(all []corev1.Secret, names map[string]bool) {
	type secretKeys struct {
		Name string            `json:"name"`
		Type corev1.SecretType `json:"type"`
		Data map[string]string `json:"data"`
	}
	var listed []secretKeys
	for _, s := range all {
		if !names[s.Name] {
			continue
		}
		delete(names, s.Name)
		keys := map[string]string{}
		for k, v := range s.Data {
			keys[k] = fmt.Sprintf("%s (%d bytes)", redacted, len(v))
			r.secret(string(v))
		}
		listed = append(listed, secretKeys{Name: s.Name, Type: s.Type, Data: keys})
	}
	for n := range names {
		r.miss("Secret %s: used by the inbox's pods, but it does not exist or could not be read", n)
	}
	slices.SortFunc(listed, func(a, b secretKeys) int { return strings.Compare(a.Name, b.Name) })
	b, err := yaml.Marshal(map[string]any{"items": listed})
	if err != nil {
		r.miss("secrets.yaml: %v", err)
		return
	}
	r.add("objects/secrets.yaml", b)
}

// secret remembers a Secret value to redact: the value, each of its lines, and the password of
// a URL in it.
func (r *report) secret(v string) {
	for _, s := range append([]string{v}, strings.Split(v, "\n")...) {
		s = strings.TrimSpace(s)
		if len(s) >= minScrubbed {
			r.secrets = append(r.secrets, s)
		}
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok && len(p) >= minScrubbed {
				r.secrets = append(r.secrets, p, url.QueryEscape(p), url.PathEscape(p))
			}
		}
	}
}

// addLogs stores the logs of each container of the pod, or why they could not be read.
func (r *report) addLogs(ctx context.Context, c *clients, dir string, pod *corev1.Pod, o reportOptions) {
	for _, ctr := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		opts := &corev1.PodLogOptions{Container: ctr.Name, SinceSeconds: ptr.To(int64(o.since.Seconds())), TailLines: ptr.To(o.tail)}
		b, err := c.core.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, opts).DoRaw(ctx)
		if err != nil {
			r.miss("log of %s/%s container %s: %v", pod.Namespace, pod.Name, ctr.Name, err)
			continue
		}
		r.add(path.Join(dir, pod.Name, ctr.Name+".log"), b)
	}
}

// readme says what the report is and what it lacks.
func (r *report) readme(inbox *v1alpha1.SequentialInbox, now time.Time) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "Support report of SequentialInbox %s/%s, written %s by kubectl seqinbox %s.\n\n",
		inbox.Namespace, inbox.Name, now.UTC().Format(time.RFC3339), version.Version)
	b.WriteString(`status.txt, status.yaml   the status screen (kubectl seqinbox status) and its data
inbox.yaml, actions.yaml  the SequentialInbox and its SequentialInboxActions
objects/                  what the operator made for them, and the Secrets they use (keys only)
events.yaml               the events of all of these
logs/                     the logs of the consumer, Job and operator pods

No Secret value is in this archive: every value of the Secrets in objects/secrets.yaml is
replaced by ` + redacted + ` wherever it appeared.
`)
	if len(r.missing) > 0 {
		b.WriteString("\nNot collected:\n")
		for _, m := range r.missing {
			b.WriteString("- " + m + "\n")
		}
	}
	return []byte(b.String())
}

// scrub replaces every remembered Secret value in data, longest first (a value may contain another).
func (r *report) scrub(data []byte) []byte {
	secrets := slices.Clone(r.secrets)
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		data = bytes.ReplaceAll(data, []byte(s), []byte(redacted))
	}
	return data
}

// write writes the archive to file (through a temporary file, so that no half archive is left)
// and returns its size.
func (r *report) write(file string) (int64, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	names := make([]string, 0, len(r.files))
	for n := range r.files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		data := r.scrub(r.files[n])
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o600, Size: int64(len(data)), ModTime: time.Now()}); err != nil {
			return 0, fmt.Errorf("write %s: %w", file, err)
		}
		if _, err := tw.Write(data); err != nil {
			return 0, fmt.Errorf("write %s: %w", file, err)
		}
	}
	if err := tw.Close(); err != nil {
		return 0, fmt.Errorf("write %s: %w", file, err)
	}
	if err := gz.Close(); err != nil {
		return 0, fmt.Errorf("write %s: %w", file, err)
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o600); err != nil {
		return 0, fmt.Errorf("write the report: %w", err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return 0, fmt.Errorf("write the report: %w", err)
	}
	return int64(buf.Len()), nil
}
