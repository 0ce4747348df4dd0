package controller

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

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
		sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
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
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
		t.Errorf("resources = %+v, want cpu and memory requests and a memory limit", c.Resources)
	}
}

func TestConsumerContainerRunsTheRenderedManifestWithProbesAndMetrics(t *testing.T) {
	s := renderScope()
	d := consumerDeployment(s)
	c := d.Spec.Template.Spec.Containers[0]
	wantArgs := []string{"consume", "-f", "/etc/seqinbox/inbox.yaml", "--health-probe-bind-address", ":8081", "--metrics-bind-address", ":8080", "--instance-id", "$(POD_NAME)"}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("args = %q, want %q", c.Args, wantArgs)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes = %+v / %+v, want /healthz and /readyz", c.LivenessProbe, c.ReadinessProbe)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 8080 }) {
		t.Errorf("ports = %+v, want metrics on 8080", c.Ports)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if ref := env["SEQINBOX_DATABASE_URL"].ValueFrom; ref == nil || ref.SecretKeyRef.Name != "db" || ref.SecretKeyRef.Key != "url" {
		t.Errorf("SEQINBOX_DATABASE_URL = %+v, want from secret db/url", env["SEQINBOX_DATABASE_URL"])
	}
	if ref := env["SEQINBOX_KAFKA_PASSWORD"].ValueFrom; ref == nil || ref.SecretKeyRef.Name != "kafka-user" || ref.SecretKeyRef.Key != "password" {
		t.Errorf("SEQINBOX_KAFKA_PASSWORD = %+v, want from secret kafka-user/password", env["SEQINBOX_KAFKA_PASSWORD"])
	}
	if got := env["SEQINBOX_KAFKA_CA_FILE"].Value; got != "/etc/seqinbox/kafka-ca.crt" {
		t.Errorf("SEQINBOX_KAFKA_CA_FILE = %q", got)
	}
	if env["SEQINBOX_KAFKA_CERT_FILE"].Value != "/etc/seqinbox/kafka-client.crt" || env["SEQINBOX_KAFKA_KEY_FILE"].Value != "/etc/seqinbox/kafka-client.key" {
		t.Errorf("client certificate files = %q, %q", env["SEQINBOX_KAFKA_CERT_FILE"].Value, env["SEQINBOX_KAFKA_KEY_FILE"].Value)
	}
	if ref := env["POD_NAME"].ValueFrom; ref == nil || ref.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("POD_NAME = %+v, want the pod's name", env["POD_NAME"])
	}
	sources := d.Spec.Template.Spec.Volumes[0].Projected.Sources
	if sources[0].ConfigMap.Name != s.configMap || sources[1].Secret.Name != "kafka-ca" || sources[1].Secret.Items[0].Path != kafkaCAFile {
		t.Errorf("config volume sources = %+v, want the rendered ConfigMap and the CA", sources)
	}
	if len(sources) != 4 || sources[2].Secret.Name != "orders-user" || sources[2].Secret.Items[0] != (corev1.KeyToPath{Key: "user.crt", Path: kafkaCertFile}) ||
		sources[3].Secret.Items[0] != (corev1.KeyToPath{Key: "user.key", Path: kafkaKeyFile}) {
		t.Errorf("config volume sources = %+v, want the Strimzi KafkaUser Secret's user.crt and user.key", sources)
	}
	annotations := d.Spec.Template.Annotations
	if annotations[annotationConfigHash] != s.configHash || annotations[annotationClaimProtocol] != "insert-first-v1" || annotations[annotationEngineVersion] != "v1.0.0" {
		t.Errorf("pod template annotations = %v, want config hash and the target engine", annotations)
	}
	if got := runningEngine(d); got != engineV1 {
		t.Errorf("runningEngine(rendered) = %+v, want %+v: a later pass must read back what it wrote", got, engineV1)
	}
}

// TestConsumerLearnsItsMemoryLimitOnlyWhenItHasOne: the downward API would give the node's
// allocatable memory for a container without a limit, far more than the pod may use.
func TestConsumerLearnsItsMemoryLimitOnlyWhenItHasOne(t *testing.T) {
	memoryLimit := func(s *scope) *corev1.EnvVar {
		for _, e := range consumerDeployment(s).Spec.Template.Spec.Containers[0].Env {
			if e.Name == "SEQINBOX_MEMORY_LIMIT" {
				return &e
			}
		}
		return nil
	}
	s := renderScope()
	e := memoryLimit(s)
	if e == nil || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil ||
		*e.ValueFrom.ResourceFieldRef != (corev1.ResourceFieldSelector{ContainerName: consumerContainer, Resource: "limits.memory"}) {
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
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
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
	if svc.Spec.Ports[0].Port != 8080 || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" {
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
	if !slices.Equal(c.Args, wantArgs) || c.Image != s.image {
		t.Errorf("container = %s %q, want %s %q", c.Image, c.Args, s.image, wantArgs)
	}
	if *job.Spec.BackoffLimit != 0 || job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Error("the Job controller retries on its own; the operator counts attempts")
	}
	if c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
		t.Errorf("termination message policy = %s, want the log tail on error", c.TerminationMessagePolicy)
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
