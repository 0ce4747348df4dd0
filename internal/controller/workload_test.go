package controller

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

func renderScope() *scope {
	inbox := &v1alpha1.SequentialInbox{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop"},
		Spec: v1alpha1.SequentialInboxSpec{
			Kafka: v1alpha1.KafkaSpec{
				BootstrapServers: []string{"kafka:9092"}, Topics: []string{"orders"}, ConsumerGroup: "orders",
				MaxPollIntervalMs: 300000,
				TLS: &v1alpha1.KafkaTLS{CASecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "kafka-ca"}, Key: "ca.crt"},
					ClientCertificate: &v1alpha1.KafkaClientCertificate{SecretName: "orders-user"}},
				SASL: &v1alpha1.KafkaSASL{Mechanism: "SCRAM-SHA-512",
					UsernameSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "kafka-user"}, Key: "user"},
					PasswordSecretRef: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "kafka-user"}, Key: "password"}},
			},
			Database: v1alpha1.DatabaseSpec{URLSecretRef: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "db"}, Key: "url"}, PoolSize: 10},
			Replicas: ptr.To(int32(3)),
		},
	}
	return &scope{inbox: inbox, image: engineV1.Image, target: engineV1, configMap: "orders-config-0123456789", configHash: "0123456789abcdef", replicas: 3}
}

func TestConsumerPodsRunNonRootWithReadOnlyRootAndNoPrivileges(t *testing.T) {
	d := consumerDeployment(renderScope())
	pod := d.Spec.Template.Spec
	if sc := pod.SecurityContext; sc == nil || !ptr.Deref(sc.RunAsNonRoot, false) || sc.SeccompProfile == nil ||
		ptr.Deref(sc.SeccompProfile.Type, "") != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context = %+v, want non-root with RuntimeDefault seccomp", sc)
	}
	if ptr.Deref(pod.AutomountServiceAccountToken, true) {
		t.Error("consumer pods mount a service account token they do not need")
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("container has no security context")
	case !ptr.Deref(sc.ReadOnlyRootFilesystem, false):
		t.Error("root filesystem is writable")
	case ptr.Deref(sc.AllowPrivilegeEscalation, true):
		t.Error("privilege escalation is allowed")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities = %+v, want drop ALL and add none", sc.Capabilities)
	}
	if r := c.Resources; r == nil || r.Requests == nil || r.Limits == nil ||
		r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() || r.Requests.Cpu().IsZero() {
		t.Errorf("resources = %+v, want cpu and memory requests and a memory limit", c.Resources)
	}
}

func TestConsumerContainerRunsTheRenderedManifestWithProbesAndMetrics(t *testing.T) {
	s := renderScope()
	d := consumerDeployment(s)
	c := d.Spec.Template.Spec.Containers[0]
	wantArgs := []string{"consume", "-f", "/etc/seqinbox/inbox.yaml", "--health-probe-bind-address", ":8081", "--metrics-bind-address", ":8080",
		"--state-bind-address", ":8443", "--state-credentials-dir", "/etc/seqinbox-state", "--instance-id", "$(POD_NAME)"}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("args = %q, want %q", c.Args, wantArgs)
	}
	if c.LivenessProbe == nil || ptr.Deref(c.LivenessProbe.HTTPGet.Path, "") != "/healthz" ||
		c.ReadinessProbe == nil || ptr.Deref(c.ReadinessProbe.HTTPGet.Path, "") != "/readyz" {
		t.Errorf("probes = %+v / %+v, want /healthz and /readyz", c.LivenessProbe, c.ReadinessProbe)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1ac.ContainerPortApplyConfiguration) bool {
		return ptr.Deref(p.Name, "") == "metrics" && ptr.Deref(p.ContainerPort, 0) == 8080
	}) {
		t.Errorf("ports = %+v, want metrics on 8080", c.Ports)
	}
	env := map[string]corev1ac.EnvVarApplyConfiguration{}
	for _, e := range c.Env {
		env[ptr.Deref(e.Name, "")] = e
	}
	secretKey := func(e corev1ac.EnvVarApplyConfiguration) string {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			return ""
		}
		return ptr.Deref(e.ValueFrom.SecretKeyRef.Name, "") + "/" + ptr.Deref(e.ValueFrom.SecretKeyRef.Key, "")
	}
	if got := secretKey(env["SEQINBOX_DATABASE_URL"]); got != "db/url" {
		t.Errorf("SEQINBOX_DATABASE_URL from secret %q, want from secret db/url", got)
	}
	if got := secretKey(env["SEQINBOX_KAFKA_PASSWORD"]); got != "kafka-user/password" {
		t.Errorf("SEQINBOX_KAFKA_PASSWORD from secret %q, want from secret kafka-user/password", got)
	}
	value := func(name string) string { return ptr.Deref(env[name].Value, "") }
	if got := value("SEQINBOX_KAFKA_CA_FILE"); got != "/etc/seqinbox/kafka-ca.crt" {
		t.Errorf("SEQINBOX_KAFKA_CA_FILE = %q", got)
	}
	if value("SEQINBOX_KAFKA_CERT_FILE") != "/etc/seqinbox/kafka-client.crt" || value("SEQINBOX_KAFKA_KEY_FILE") != "/etc/seqinbox/kafka-client.key" {
		t.Errorf("client certificate files = %q, %q", value("SEQINBOX_KAFKA_CERT_FILE"), value("SEQINBOX_KAFKA_KEY_FILE"))
	}
	if ref := env["POD_NAME"].ValueFrom; ref == nil || ref.FieldRef == nil || ptr.Deref(ref.FieldRef.FieldPath, "") != "metadata.name" {
		t.Errorf("POD_NAME = %+v, want the pod's name", env["POD_NAME"])
	}
	sources := d.Spec.Template.Spec.Volumes[0].Projected.Sources
	if ptr.Deref(sources[0].ConfigMap.Name, "") != s.configMap || ptr.Deref(sources[1].Secret.Name, "") != "kafka-ca" ||
		keyToPath(sources[1].Secret.Items[0]).Path != kafkaCAFile {
		t.Errorf("config volume sources = %+v, want the rendered ConfigMap and the CA", sources)
	}
	if len(sources) != 4 || ptr.Deref(sources[2].Secret.Name, "") != "orders-user" ||
		keyToPath(sources[2].Secret.Items[0]) != (corev1.KeyToPath{Key: "user.crt", Path: kafkaCertFile}) ||
		keyToPath(sources[3].Secret.Items[0]) != (corev1.KeyToPath{Key: "user.key", Path: kafkaKeyFile}) {
		t.Errorf("config volume sources = %+v, want the Strimzi KafkaUser Secret's user.crt and user.key", sources)
	}
	annotations := d.Spec.Template.Annotations
	if annotations[annotationConfigHash] != s.configHash || annotations[annotationClaimProtocol] != "insert-first-v1" || annotations[annotationEngineVersion] != "v1.0.0" {
		t.Errorf("pod template annotations = %v, want config hash and the target engine", annotations)
	}
	written, err := appliedDeployment(d)
	if err != nil {
		t.Fatal(err)
	}
	if got := runningEngine(written); got != engineV1 {
		t.Errorf("runningEngine(rendered) = %+v, want %+v: a later pass must read back what it wrote", got, engineV1)
	}
}

// TestConsumerLearnsItsMemoryLimitOnlyWhenItHasOne: the downward API would give the node's
// allocatable memory for a container without a limit, far more than the pod may use.
func TestConsumerLearnsItsMemoryLimitOnlyWhenItHasOne(t *testing.T) {
	memoryLimit := func(s *scope) *corev1ac.EnvVarApplyConfiguration {
		for _, e := range consumerDeployment(s).Spec.Template.Spec.Containers[0].Env {
			if ptr.Deref(e.Name, "") == "SEQINBOX_MEMORY_LIMIT" {
				return &e
			}
		}
		return nil
	}
	s := renderScope()
	e := memoryLimit(s)
	if e == nil || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil || e.ValueFrom.ResourceFieldRef.Divisor != nil ||
		ptr.Deref(e.ValueFrom.ResourceFieldRef.ContainerName, "") != consumerContainer ||
		ptr.Deref(e.ValueFrom.ResourceFieldRef.Resource, "") != "limits.memory" {
		t.Errorf("SEQINBOX_MEMORY_LIMIT = %+v, want the consumer container's limits.memory (the default resources have a limit)", e)
	}
	s.inbox.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}
	if e := memoryLimit(s); e != nil {
		t.Errorf("SEQINBOX_MEMORY_LIMIT = %+v for a container without a memory limit, want it unset", e)
	}
}

func TestConsumerDeploymentNeverDropsBelowTheAskedReplicas(t *testing.T) {
	d := consumerDeployment(renderScope())
	if *d.Spec.Replicas != 3 {
		t.Errorf("replicas = %d, want 3", *d.Spec.Replicas)
	}
	if ptr.Deref(d.Spec.Strategy.Type, "") != appsv1.RollingUpdateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("strategy = %+v, want a rolling update without unavailability", d.Spec.Strategy)
	}
	if grace := *d.Spec.Template.Spec.TerminationGracePeriodSeconds; grace != 330 {
		t.Errorf("termination grace = %ds, want maxPollInterval 300s + 30s", grace)
	}
}

func TestPDBAndServiceSelectTheConsumerPods(t *testing.T) {
	s := renderScope()
	d := consumerDeployment(s)
	pdb := consumerPDB(s.inbox)
	svc := metricsService(s.inbox)
	if pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB maxUnavailable = %v, want 1", pdb.Spec.MaxUnavailable)
	}
	for name, selector := range map[string]map[string]string{"PDB": pdb.Spec.Selector.MatchLabels, "Service": svc.Spec.Selector} {
		for k, v := range selector {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("%s selector %s=%s does not match the consumer pods (%v)", name, k, v, d.Spec.Template.Labels)
			}
		}
		if len(selector) == 0 {
			t.Errorf("%s selects every pod", name)
		}
	}
	if port := svc.Spec.Ports[0]; ptr.Deref(port.Port, 0) != 8080 || ptr.Deref(port.TargetPort, intstr.IntOrString{}).StrVal != "metrics" {
		t.Errorf("service ports = %+v, want 8080 → metrics", svc.Spec.Ports)
	}
}

func TestJobsRunMigrateFromTheTargetImageWithoutJobRetries(t *testing.T) {
	s := renderScope()
	run := &v1alpha1.JobRunStatus{Key: "abcd1234", Attempt: 2}
	job := buildJob(s.inbox, s.image, jobRequest{component: componentProbe, run: run, args: reportArgs("--dry-run"),
		annotations: map[string]string{annotationConsumersStopped: "true"}}, "orders-probe-abcd1234-2")
	c := job.Spec.Template.Spec.Containers[0]
	wantArgs := []string{"migrate", "--output", "json", "--termination-message-path", "/dev/termination-log", "--dry-run"}
	if !slices.Equal(c.Args, wantArgs) || ptr.Deref(c.Image, "") != s.image {
		t.Errorf("container = %s %q, want %s %q", ptr.Deref(c.Image, ""), c.Args, s.image, wantArgs)
	}
	if *job.Spec.BackoffLimit != 0 || ptr.Deref(job.Spec.Template.Spec.RestartPolicy, "") != corev1.RestartPolicyNever {
		t.Error("the Job controller retries on its own; the operator counts attempts")
	}
	if got := ptr.Deref(c.TerminationMessagePolicy, ""); got != corev1.TerminationMessageFallbackToLogsOnError {
		t.Errorf("termination message policy = %s, want the log tail on error", got)
	}
	if job.Annotations[annotationConsumersStopped] != "true" || job.Annotations[annotationAttempt] != "2" {
		t.Errorf("annotations = %v", job.Annotations)
	}
	if got := len(jobName(&v1alpha1.SequentialInbox{ObjectMeta: metav1.ObjectMeta{Name: "a234567890123456789012345678901234567890"}},
		componentMigration, "abcd1234", 99999)); got > 63 {
		t.Errorf("the longest Job name has %d characters; a pod label holds 63", got)
	}
}

// The kubelet writes projected files owned by root, with the group fsGroup when the pod sets one.
// A consumer running as a non-root user reads its configuration only through that group or the
// "other" bits; on a real cluster a pod without fsGroup failed with "permission denied".
func TestConsumerUserCanReadTheMountedConfiguration(t *testing.T) {
	pod := consumerDeployment(renderScope()).Spec.Template.Spec
	var mode int32 = 0o644
	for _, v := range pod.Volumes {
		if v.Projected != nil {
			mode = ptr.Deref(v.Projected.DefaultMode, 0o644)
		}
	}
	sc := pod.SecurityContext
	uid, gid := ptr.Deref(sc.RunAsUser, 0), ptr.Deref(sc.RunAsGroup, 0)
	readable := mode&0o004 != 0 || uid == 0 ||
		(sc.FSGroup != nil && *sc.FSGroup == gid && mode&0o040 != 0)
	if !readable {
		t.Fatalf("config files mode %#o owned by root, fsGroup %v; user %d group %d cannot read them", mode, sc.FSGroup, uid, gid)
	}
}

// keyToPath reads a projected file's key and path.
func keyToPath(k corev1ac.KeyToPathApplyConfiguration) corev1.KeyToPath {
	return corev1.KeyToPath{Key: ptr.Deref(k.Key, ""), Path: ptr.Deref(k.Path, ""), Mode: k.Mode}
}

// TestWorkloadIsControlledByTheInboxAndItsAppliedFieldsTakenBack: the Deployment, the
// PodDisruptionBudget, the Service and the Jobs name the inbox as their controller (the garbage
// collector deletes them with it, after them in a foreground deletion); a field the operator
// applies and someone else changed is the operator's again after the next pass, and a field the
// operator does not apply stays as the other writer set it.
func TestWorkloadIsControlledByTheInboxAndItsAppliedFieldsTakenBack(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	inbox := h.get("orders")
	owned := map[string]client.Object{
		deploymentName(inbox): &appsv1.Deployment{}, pdbName(inbox): &policyv1.PodDisruptionBudget{},
		metricsServiceName(inbox): &corev1.Service{},
	}
	for _, j := range append(h.jobs("orders", componentProbe), h.jobs("orders", componentMigration)...) {
		owned[j.Name] = &batchv1.Job{}
	}
	for name, obj := range owned {
		h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, obj))
		ref := metav1.GetControllerOf(obj)
		if ref == nil || ref.UID != inbox.UID || ref.Kind != "SequentialInbox" || ref.APIVersion != v1alpha1.GroupVersion.String() ||
			!ptr.Deref(ref.BlockOwnerDeletion, false) {
			t.Errorf("%T %s has controller %+v, want the SequentialInbox %s blocking its owner's deletion", obj, name, ref, inbox.Name)
		}
	}

	d := h.deployment("orders")
	d.Spec.RevisionHistoryLimit = ptr.To(int32(10))
	d.Labels["team"] = "payments"
	h.must(k8s.Update(h.ctx, d, client.FieldOwner("someone-else")))
	h.reconcile("orders")
	d = h.deployment("orders")
	if got := ptr.Deref(d.Spec.RevisionHistoryLimit, 0); got != 3 {
		t.Errorf("revisionHistoryLimit = %d after the next pass, want the applied 3 back", got)
	}
	if d.Labels["team"] != "payments" {
		t.Errorf("labels = %v, want the other writer's team=payments kept", d.Labels)
	}
}

// TestAJobIsAppliedOnceAndAnotherWritersJobIsNotTakenOver: applying an attempt's Job again (a
// pass that did not see its own write yet) leaves it unchanged; a Job of that name that someone
// else created is an error, and stays without the inbox as its owner.
func TestAJobIsAppliedOnceAndAnotherWritersJobIsNotTakenOver(t *testing.T) {
	h := newHarness(t)
	inbox := h.create("orders", nil)
	s := &scope{inbox: inbox, image: imageV1}
	req := jobRequest{component: componentProbe, run: &v1alpha1.JobRunStatus{Key: "k", Attempt: 1}, args: reportArgs("--dry-run")}
	h.must(h.r.createJob(h.ctx, s, req, "orders-probe-k-1"))
	var first, again batchv1.Job
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "orders-probe-k-1"}, &first))
	h.must(h.r.createJob(h.ctx, s, req, "orders-probe-k-1"))
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "orders-probe-k-1"}, &again))
	if again.ResourceVersion != first.ResourceVersion {
		t.Errorf("the second apply changed the Job (resourceVersion %s → %s)", first.ResourceVersion, again.ResourceVersion)
	}

	foreign := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "orders-probe-k-2", Namespace: h.ns},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: jobContainer, Image: "example.com/other:1"}}}}},
	}
	h.must(k8s.Create(h.ctx, foreign, client.FieldOwner("someone-else")))
	req.run.Attempt = 2
	if err := h.r.createJob(h.ctx, s, req, foreign.Name); err == nil {
		t.Error("applying over another writer's Job succeeded, want a conflict")
	}
	h.must(k8s.Get(h.ctx, client.ObjectKeyFromObject(foreign), foreign))
	if len(foreign.OwnerReferences) != 0 || foreign.Spec.Template.Spec.Containers[0].Image != "example.com/other:1" {
		t.Errorf("the other writer's Job was changed: owners %+v, image %s", foreign.OwnerReferences, foreign.Spec.Template.Spec.Containers[0].Image)
	}
}
