package controller

import (
	"context"
	"fmt"
	"path"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/kafkaauth"
)

// The consumer container's name, ports and files.
const (
	consumerContainer = "consumer"
	metricsPort       = 8080
	healthPort        = 8081
	kafkaCAFile       = "kafka-ca.crt"
	kafkaCertFile     = "kafka-client.crt"
	kafkaKeyFile      = "kafka-client.key"
	sinkCAFile        = "sink-ca.crt"
	sinkCertFile      = "sink-client.crt"
	sinkKeyFile       = "sink-client.key"
	sinkTokenFile     = "sink-token"
	// runAsUser is the distroless "nonroot" user the image runs as.
	runAsUser = 65532
	// shutdownMargin is added to maxPollIntervalMs for the termination grace period: a consumer
	// finishes its in-flight records, commits and leaves the group before it is killed.
	shutdownMargin = 30
)

// ensureWorkload applies the consumer Deployment, its PodDisruptionBudget and the metrics Service
// with server-side apply, and records what now runs.
func (r *Reconciler) ensureWorkload(ctx context.Context, s *scope) (phaseResult, error) {
	deployment := consumerDeployment(s)
	applied, err := r.apply(ctx, s.inbox, deployment)
	if err != nil {
		return proceed, err
	}
	var current appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(applied, &current); err != nil {
		return proceed, fmt.Errorf("decode applied deployment: %w", err)
	}
	s.deployment = &current
	s.running = runningEngine(&current)
	for _, obj := range []client.Object{consumerPDB(s.inbox), metricsService(s.inbox)} {
		if _, err := r.apply(ctx, s.inbox, obj); err != nil {
			return proceed, err
		}
	}
	if ok, _ := deploymentAvailable(s.deployment); ok && s.deployment.Status.Replicas == s.deployment.Status.UpdatedReplicas {
		if err := r.deleteStaleConfigMaps(ctx, s); err != nil {
			return proceed, err
		}
	}
	return proceed, nil
}

// apply server-side applies obj (owned by the inbox) as the operator's field manager and returns
// the object the server holds afterwards.
func (r *Reconciler) apply(ctx context.Context, inbox *v1alpha1.SequentialInbox, obj client.Object) (map[string]any, error) {
	if err := controllerutil.SetControllerReference(inbox, obj, r.Client.Scheme()); err != nil {
		return nil, fmt.Errorf("own %s: %w", obj.GetName(), err)
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("convert %s: %w", obj.GetName(), err)
	}
	// Typed objects carry zero values that are not part of the intent.
	delete(u, "status")
	unstructured.RemoveNestedField(u, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u, "spec", "template", "metadata", "creationTimestamp")
	applyObj := &unstructured.Unstructured{Object: u}
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(applyObj), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("apply %s %s: %w", applyObj.GetKind(), obj.GetName(), err)
	}
	return applyObj.Object, nil
}

// consumerDeployment renders the consumer Deployment for the target image and configuration.
func consumerDeployment(s *scope) *appsv1.Deployment {
	inbox := s.inbox
	labels := objectLabels(inbox, componentConsumer)
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: deploymentName(inbox), Namespace: inbox.Namespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas:             ptr.To(s.replicas),
			Selector:             &metav1.LabelSelector{MatchLabels: selectorLabels(inbox, componentConsumer)},
			RevisionHistoryLimit: ptr.To(int32(3)),
			// Within one claim protocol old and new consumers may overlap; never fewer than asked.
			Strategy: appsv1.DeploymentStrategy{
				Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
					MaxSurge:       ptr.To(intstr.FromInt32(1)),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels: labels,
					Annotations: map[string]string{
						annotationConfigHash:    s.configHash,
						annotationEngineVersion: s.target.Version,
						annotationClaimProtocol: s.target.ClaimProtocol,
						annotationGroupProtocol: s.target.GroupProtocol,
					},
				},
				Spec: consumerPodSpec(s),
			},
		},
	}
}

func consumerPodSpec(s *scope) corev1.PodSpec {
	inbox := s.inbox
	grace := int64(inbox.Spec.Kafka.MaxPollIntervalMs/1000) + shutdownMargin
	return corev1.PodSpec{
		AutomountServiceAccountToken:  ptr.To(false),
		EnableServiceLinks:            ptr.To(false),
		TerminationGracePeriodSeconds: &grace,
		SecurityContext:               podSecurityContext(),
		ImagePullSecrets:              inbox.Spec.ImagePullSecrets,
		TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
			MaxSkew:           1,
			TopologyKey:       "kubernetes.io/hostname",
			WhenUnsatisfiable: corev1.ScheduleAnyway,
			LabelSelector:     &metav1.LabelSelector{MatchLabels: selectorLabels(inbox, componentConsumer)},
		}},
		Containers: []corev1.Container{{
			Name:  consumerContainer,
			Image: s.image,
			Args: []string{"consume", "-f", configPath,
				"--health-probe-bind-address", fmt.Sprintf(":%d", healthPort),
				"--metrics-bind-address", fmt.Sprintf(":%d", metricsPort),
				"--instance-id", "$(POD_NAME)"},
			Env: consumerEnv(inbox),
			Ports: []corev1.ContainerPort{
				{Name: "metrics", ContainerPort: metricsPort, Protocol: corev1.ProtocolTCP},
				{Name: "health", ContainerPort: healthPort, Protocol: corev1.ProtocolTCP},
			},
			LivenessProbe: &corev1.Probe{
				ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("health")}},
				PeriodSeconds:    10,
				FailureThreshold: 3,
			},
			// Ready only after the schema check and the version fence passed (SPEC §7).
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("health")}},
				PeriodSeconds: 5,
			},
			Resources:                consumerResources(inbox),
			SecurityContext:          containerSecurityContext(),
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			VolumeMounts: []corev1.VolumeMount{
				{Name: "config", MountPath: configDir, ReadOnly: true},
				{Name: "tmp", MountPath: "/tmp"},
			},
		}},
		Volumes: []corev1.Volume{
			{Name: "config", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				DefaultMode: ptr.To(int32(0o440)),
				Sources:     configSources(s),
			}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("64Mi"))}}},
		},
	}
}

// configSources project the rendered manifest and, with TLS, the Kafka CA and the client
// certificate and key into configDir.
func configSources(s *scope) []corev1.VolumeProjection {
	sources := []corev1.VolumeProjection{{ConfigMap: &corev1.ConfigMapProjection{
		LocalObjectReference: corev1.LocalObjectReference{Name: s.configMap},
		Items:                []corev1.KeyToPath{{Key: configKey, Path: configKey}},
	}}}
	secretFile := func(ref corev1.SecretKeySelector, file string) corev1.VolumeProjection {
		return corev1.VolumeProjection{Secret: &corev1.SecretProjection{
			LocalObjectReference: ref.LocalObjectReference,
			Items:                []corev1.KeyToPath{{Key: ref.Key, Path: file}},
		}}
	}
	tls := s.inbox.Spec.Kafka.TLS
	if tls != nil && tls.CASecretRef != nil {
		sources = append(sources, secretFile(*tls.CASecretRef, kafkaCAFile))
	}
	if tls != nil && tls.ClientCertificate != nil {
		cert, key := kafkaauth.ClientCertificateRefs(tls.ClientCertificate)
		sources = append(sources, secretFile(cert, kafkaCertFile), secretFile(key, kafkaKeyFile))
	}
	for _, f := range sinkFiles(&s.inbox.Spec.Sink) {
		sources = append(sources, secretFile(f.ref, f.file))
	}
	return sources
}

// fileFromSecret is one Secret key that the consumer reads as a file: where it comes from, the file
// in configDir and the variable that names the file.
type fileFromSecret struct {
	ref       corev1.SecretKeySelector
	file, env string
}

// sinkFiles are the Secret keys of spec.sink's TLS and token, as files.
func sinkFiles(sink *v1alpha1.SinkSpec) []fileFromSecret {
	var files []fileFromSecret
	if t := sink.TLS; t != nil && t.CASecretRef != nil {
		files = append(files, fileFromSecret{*t.CASecretRef, sinkCAFile, "SEQINBOX_SINK_CA_FILE"})
	}
	if t := sink.TLS; t != nil && t.ClientCertificate != nil {
		c := t.ClientCertificate
		ref := corev1.LocalObjectReference{Name: c.SecretName}
		certKey, keyKey := c.CertificateKey, c.PrivateKeyKey
		if certKey == "" {
			certKey = corev1.TLSCertKey
		}
		if keyKey == "" {
			keyKey = corev1.TLSPrivateKeyKey
		}
		files = append(files,
			fileFromSecret{corev1.SecretKeySelector{LocalObjectReference: ref, Key: certKey}, sinkCertFile, "SEQINBOX_SINK_CERT_FILE"},
			fileFromSecret{corev1.SecretKeySelector{LocalObjectReference: ref, Key: keyKey}, sinkKeyFile, "SEQINBOX_SINK_KEY_FILE"})
	}
	if ref := sink.BearerTokenSecretRef; ref != nil {
		files = append(files, fileFromSecret{*ref, sinkTokenFile, "SEQINBOX_SINK_TOKEN_FILE"})
	}
	return files
}

// consumerEnv passes the pod name, the Secret-held settings and the memory limit; the rest is in the
// manifest.
func consumerEnv(inbox *v1alpha1.SequentialInbox) []corev1.EnvVar {
	env := []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		databaseURLEnv(inbox),
	}
	if sasl := inbox.Spec.Kafka.SASL; sasl != nil {
		user := corev1.EnvVar{Name: "SEQINBOX_KAFKA_USERNAME", Value: sasl.Username}
		if sasl.UsernameSecretRef != nil {
			user = corev1.EnvVar{Name: user.Name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: sasl.UsernameSecretRef.DeepCopy()}}
		}
		env = append(env, user,
			corev1.EnvVar{Name: "SEQINBOX_KAFKA_PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: sasl.PasswordSecretRef.DeepCopy()}})
	}
	tls := inbox.Spec.Kafka.TLS
	if tls != nil && tls.CASecretRef != nil {
		env = append(env, corev1.EnvVar{Name: "SEQINBOX_KAFKA_CA_FILE", Value: path.Join(configDir, kafkaCAFile)})
	}
	if tls != nil && tls.ClientCertificate != nil {
		env = append(env,
			corev1.EnvVar{Name: "SEQINBOX_KAFKA_CERT_FILE", Value: path.Join(configDir, kafkaCertFile)},
			corev1.EnvVar{Name: "SEQINBOX_KAFKA_KEY_FILE", Value: path.Join(configDir, kafkaKeyFile)})
	}
	for _, f := range sinkFiles(&inbox.Spec.Sink) {
		env = append(env, corev1.EnvVar{Name: f.env, Value: path.Join(configDir, f.file)})
	}
	// The consumer bounds the bytes of the records it holds by a share of its memory limit. Only a
	// set limit is passed: without one, the downward API would give the node's allocatable memory.
	if _, ok := consumerResources(inbox).Limits[corev1.ResourceMemory]; ok {
		env = append(env, corev1.EnvVar{Name: "SEQINBOX_MEMORY_LIMIT", ValueFrom: &corev1.EnvVarSource{
			ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: consumerContainer, Resource: "limits.memory"}}})
	}
	return env
}

// databaseURLEnv hands the database URL from its Secret to the consumer and the Jobs.
func databaseURLEnv(inbox *v1alpha1.SequentialInbox) corev1.EnvVar {
	return corev1.EnvVar{Name: "SEQINBOX_DATABASE_URL",
		ValueFrom: &corev1.EnvVarSource{SecretKeyRef: inbox.Spec.Database.URLSecretRef.DeepCopy()}}
}

// podSecurityContext: non-root, with the runtime's default seccomp profile. FSGroup gives the
// non-root user the group of the mounted configuration, whose files are 0440 and owned by root.
func podSecurityContext() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To(int64(runAsUser)),
		RunAsGroup:     ptr.To(int64(runAsUser)),
		FSGroup:        ptr.To(int64(runAsUser)),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// containerSecurityContext meets the "restricted" Pod Security Standard with a read-only root.
func containerSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             ptr.To(true),
		ReadOnlyRootFilesystem:   ptr.To(true),
		AllowPrivilegeEscalation: ptr.To(false),
		Privileged:               ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// consumerResources are spec.resources, or requests and a memory limit that fit a consumer with
// the default pool.
func consumerResources(inbox *v1alpha1.SequentialInbox) corev1.ResourceRequirements {
	if len(inbox.Spec.Resources.Requests) > 0 || len(inbox.Spec.Resources.Limits) > 0 {
		return *inbox.Spec.Resources.DeepCopy()
	}
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
	}
}

// jobResources fit one `seqinbox migrate` run.
func jobResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
}

// consumerPDB lets voluntary disruptions (node drains) take one consumer at a time.
func consumerPDB(inbox *v1alpha1.SequentialInbox) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: metav1.ObjectMeta{Name: pdbName(inbox), Namespace: inbox.Namespace, Labels: objectLabels(inbox, componentConsumer)},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			Selector:       &metav1.LabelSelector{MatchLabels: selectorLabels(inbox, componentConsumer)},
		},
	}
}

// metricsService exposes the consumers' Prometheus metrics.
func metricsService(inbox *v1alpha1.SequentialInbox) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: metricsServiceName(inbox), Namespace: inbox.Namespace, Labels: objectLabels(inbox, componentConsumer)},
		Spec: corev1.ServiceSpec{
			Selector: selectorLabels(inbox, componentConsumer),
			Ports:    []corev1.ServicePort{{Name: "metrics", Port: metricsPort, TargetPort: intstr.FromString("metrics"), Protocol: corev1.ProtocolTCP}},
		},
	}
}
