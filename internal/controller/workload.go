package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"path"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/kafkaauth"
	"github.com/seqinbox/seqinbox/internal/version"
)

// The consumer container's name, ports and files.
const (
	consumerContainer = "consumer"
	metricsPort       = 8080
	healthPort        = 8081
	// statePort serves the consumer's state to the operator (HTTPS), from the credentials in stateDir.
	statePort     = 8443
	statePortName = "state"
	stateDir      = "/etc/seqinbox-state"
	kafkaCAFile   = "kafka-ca.crt"
	kafkaCertFile = "kafka-client.crt"
	kafkaKeyFile  = "kafka-client.key"
	sinkCAFile    = "sink-ca.crt"
	sinkCertFile  = "sink-client.crt"
	sinkKeyFile   = "sink-client.key"
	sinkTokenFile = "sink-token"
	// runAsUser is the distroless "nonroot" user the image runs as.
	runAsUser = 65532
	// shutdownMargin is added to maxPollIntervalMs for the termination grace period: a consumer
	// finishes its in-flight records, commits and leaves the group before it is killed.
	shutdownMargin = 30
)

// ensureWorkload applies the consumer Deployment, its PodDisruptionBudget and the metrics Service
// with server-side apply, and records what now runs.
func (r *Reconciler) ensureWorkload(ctx context.Context, s *scope) (phaseResult, error) {
	owner, err := r.controllerRef(s.inbox)
	if err != nil {
		return proceed, err
	}
	if err := r.ensureStateCredentials(ctx, s); err != nil {
		return proceed, err
	}
	deployment := consumerDeployment(s).WithOwnerReferences(owner)
	if err := r.apply(ctx, deployment, client.ForceOwnership); err != nil {
		return proceed, err
	}
	if s.deployment, err = appliedDeployment(deployment); err != nil {
		return proceed, err
	}
	s.running = runningEngine(s.deployment)
	for _, obj := range []appliedObject{consumerPDB(s.inbox).WithOwnerReferences(owner), metricsService(s.inbox).WithOwnerReferences(owner)} {
		if err := r.apply(ctx, obj, client.ForceOwnership); err != nil {
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

// appliedObject is the apply configuration of one named object, as client-go generates them.
type appliedObject interface {
	runtime.ApplyConfiguration
	GetKind() *string
	GetName() *string
}

// apply server-side applies obj as the operator's field manager; the answer, the object the
// server holds afterwards, is decoded into obj.
func (r *Reconciler) apply(ctx context.Context, obj appliedObject, opts ...client.ApplyOption) error {
	if err := r.Client.Apply(ctx, obj, append(opts, client.FieldOwner(fieldOwner))...); err != nil {
		return fmt.Errorf("apply %s %s: %w", ptr.Deref(obj.GetKind(), ""), ptr.Deref(obj.GetName(), ""), err)
	}
	return nil
}

// controllerRef makes owner the controller of an applied object: the garbage collector deletes
// the object with its owner (blocking the owner's foreground deletion until then), and the
// owner's controller watches it.
func (r *Reconciler) controllerRef(owner client.Object) (*metav1ac.OwnerReferenceApplyConfiguration, error) {
	gvk, err := apiutil.GVKForObject(owner, r.Client.Scheme())
	if err != nil {
		return nil, fmt.Errorf("owner %s: %w", owner.GetName(), err)
	}
	return metav1ac.OwnerReference().
		WithAPIVersion(gvk.GroupVersion().String()).WithKind(gvk.Kind).
		WithName(owner.GetName()).WithUID(owner.GetUID()).
		WithController(true).WithBlockOwnerDeletion(true), nil
}

// appliedDeployment reads the Deployment that an apply decoded into its apply configuration: the
// Deployment as the server holds it after the apply, status included (the cache may lag behind).
func appliedDeployment(ac *appsv1ac.DeploymentApplyConfiguration) (*appsv1.Deployment, error) {
	data, err := json.Marshal(ac)
	if err != nil {
		return nil, fmt.Errorf("encode applied deployment: %w", err)
	}
	var d appsv1.Deployment
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("decode applied deployment: %w", err)
	}
	return &d, nil
}

// consumerDeployment renders the consumer Deployment for the target image and configuration.
func consumerDeployment(s *scope) *appsv1ac.DeploymentApplyConfiguration {
	inbox := s.inbox
	labels := objectLabels(inbox, componentConsumer)
	return appsv1ac.Deployment(deploymentName(inbox), inbox.Namespace).
		WithLabels(labels).
		WithSpec(appsv1ac.DeploymentSpec().
			WithReplicas(s.replicas).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(inbox, componentConsumer))).
			WithRevisionHistoryLimit(3).
			// Within one claim protocol old and new consumers may overlap; never fewer than asked.
			WithStrategy(appsv1ac.DeploymentStrategy().
				WithType(appsv1.RollingUpdateDeploymentStrategyType).
				WithRollingUpdate(appsv1ac.RollingUpdateDeployment().
					WithMaxUnavailable(intstr.FromInt32(0)).
					WithMaxSurge(intstr.FromInt32(1)))).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(labels).
				WithAnnotations(map[string]string{
					annotationConfigHash:    s.configHash,
					annotationEngineVersion: s.target.Version,
					annotationClaimProtocol: s.target.ClaimProtocol,
					annotationGroupProtocol: s.target.GroupProtocol,
				}).
				WithSpec(consumerPodSpec(s))))
}

// consumerPodSpec renders the consumers' pod. Consumers of an engine that serves its state
// (servesState) serve it on the state port from the mounted credentials; older engines know no
// such flag and get none of it.
func consumerPodSpec(s *scope) *corev1ac.PodSpecApplyConfiguration {
	inbox := s.inbox
	state := servesState(s.target.Version)
	args := []string{"consume", "-f", configPath,
		"--health-probe-bind-address", fmt.Sprintf(":%d", healthPort),
		"--metrics-bind-address", fmt.Sprintf(":%d", metricsPort)}
	ports := []*corev1ac.ContainerPortApplyConfiguration{
		corev1ac.ContainerPort().WithName("metrics").WithContainerPort(metricsPort).WithProtocol(corev1.ProtocolTCP),
		corev1ac.ContainerPort().WithName("health").WithContainerPort(healthPort).WithProtocol(corev1.ProtocolTCP)}
	mounts := []*corev1ac.VolumeMountApplyConfiguration{
		corev1ac.VolumeMount().WithName("config").WithMountPath(configDir).WithReadOnly(true)}
	volumes := []*corev1ac.VolumeApplyConfiguration{
		corev1ac.Volume().WithName("config").WithProjected(corev1ac.ProjectedVolumeSource().
			WithDefaultMode(0o440).
			WithSources(configSources(s)...))}
	if state {
		args = append(args, "--state-bind-address", fmt.Sprintf(":%d", statePort), "--state-credentials-dir", stateDir)
		ports = append(ports, corev1ac.ContainerPort().WithName(statePortName).WithContainerPort(statePort).WithProtocol(corev1.ProtocolTCP))
		mounts = append(mounts, corev1ac.VolumeMount().WithName(statePortName).WithMountPath(stateDir).WithReadOnly(true))
		volumes = append(volumes, corev1ac.Volume().WithName(statePortName).WithSecret(corev1ac.SecretVolumeSource().
			WithSecretName(stateSecretName(inbox)).
			WithDefaultMode(0o440)))
	}
	mounts = append(mounts, corev1ac.VolumeMount().WithName("tmp").WithMountPath("/tmp"))
	volumes = append(volumes, corev1ac.Volume().WithName("tmp").WithEmptyDir(corev1ac.EmptyDirVolumeSource().WithSizeLimit(resource.MustParse("64Mi"))))
	consumer := corev1ac.Container().
		WithName(consumerContainer).
		WithImage(s.image).
		WithArgs(append(args, "--instance-id", "$(POD_NAME)")...).
		WithEnv(consumerEnv(inbox)...).
		WithPorts(ports...).
		WithLivenessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath("/healthz").WithPort(intstr.FromString("health"))).
			WithPeriodSeconds(10).
			WithFailureThreshold(3)).
		// Ready only after the schema check and the version fence passed (docs/design.md#readiness).
		WithReadinessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath("/readyz").WithPort(intstr.FromString("health"))).
			WithPeriodSeconds(5)).
		WithResources(resourceRequirements(consumerResources(inbox))).
		WithVolumeMounts(mounts...)
	return hardenedPod(inbox, consumer).
		WithTerminationGracePeriodSeconds(int64(inbox.Spec.Kafka.MaxPollIntervalMs/1000) + shutdownMargin).
		WithTopologySpreadConstraints(corev1ac.TopologySpreadConstraint().
			WithMaxSkew(1).
			WithTopologyKey("kubernetes.io/hostname").
			WithWhenUnsatisfiable(corev1.ScheduleAnyway).
			WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(inbox, componentConsumer)))).
		WithVolumes(volumes...)
}

// stateServedSince is the first release whose consumers serve their state (`seqinbox consume
// --state-bind-address`); the consumers of earlier releases refuse the flag and do not start.
const stateServedSince = "v0.1.0"

// servesState reports whether the consumers of an engine version serve their state: releases
// from stateServedSince on and their pre-releases (v0.1.0-dev is built on the way to v0.1.0),
// builds that no release stamped (version.Unstamped: the source as it is) and versions that are
// no release number at all, which only builds of this source outside the releases carry.
// Release numbers before stateServedSince, the versions that pinned older images report, do not.
func servesState(engineVersion string) bool {
	if engineVersion == version.Unstamped {
		return true
	}
	v, err := utilversion.ParseSemantic(engineVersion)
	if err != nil {
		return true
	}
	release := utilversion.MajorMinor(v.Major(), v.Minor()).WithPatch(v.Patch())
	return release.AtLeast(utilversion.MustParseSemantic(stateServedSince))
}

// hardenedPod is the pod of the consumers and of every Job, around its one container c: c runs
// as the non-root user with a read-only root, no privileges and the runtime's default seccomp
// profile (the "restricted" Pod Security Standard) and leaves its log tail as termination message
// when it fails; the pod mounts no service account token, gets no service links and pulls with
// the inbox's pull secrets. FSGroup gives the user the group of the mounted configuration, whose
// files are 0440 and owned by root.
func hardenedPod(inbox *v1alpha1.SequentialInbox, c *corev1ac.ContainerApplyConfiguration) *corev1ac.PodSpecApplyConfiguration {
	pullSecrets := make([]*corev1ac.LocalObjectReferenceApplyConfiguration, 0, len(inbox.Spec.ImagePullSecrets))
	for _, ref := range inbox.Spec.ImagePullSecrets {
		pullSecrets = append(pullSecrets, corev1ac.LocalObjectReference().WithName(ref.Name))
	}
	return corev1ac.PodSpec().
		WithAutomountServiceAccountToken(false).
		WithEnableServiceLinks(false).
		WithSecurityContext(corev1ac.PodSecurityContext().
			WithRunAsNonRoot(true).
			WithRunAsUser(runAsUser).
			WithRunAsGroup(runAsUser).
			WithFSGroup(runAsUser).
			WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))).
		WithImagePullSecrets(pullSecrets...).
		WithContainers(c.
			WithSecurityContext(corev1ac.SecurityContext().
				WithRunAsNonRoot(true).
				WithReadOnlyRootFilesystem(true).
				WithAllowPrivilegeEscalation(false).
				WithPrivileged(false).
				WithCapabilities(corev1ac.Capabilities().WithDrop("ALL")).
				WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))).
			WithTerminationMessagePolicy(corev1.TerminationMessageFallbackToLogsOnError))
}

// configSources project the rendered manifest and, with TLS, the Kafka CA and the client
// certificate and key into configDir.
func configSources(s *scope) []*corev1ac.VolumeProjectionApplyConfiguration {
	sources := []*corev1ac.VolumeProjectionApplyConfiguration{corev1ac.VolumeProjection().WithConfigMap(corev1ac.ConfigMapProjection().
		WithName(s.configMap).
		WithItems(corev1ac.KeyToPath().WithKey(configKey).WithPath(configKey)))}
	secretFile := func(ref corev1.SecretKeySelector, file string) *corev1ac.VolumeProjectionApplyConfiguration {
		return corev1ac.VolumeProjection().WithSecret(corev1ac.SecretProjection().
			WithName(ref.Name).
			WithItems(corev1ac.KeyToPath().WithKey(ref.Key).WithPath(file)))
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
func consumerEnv(inbox *v1alpha1.SequentialInbox) []*corev1ac.EnvVarApplyConfiguration {
	value := func(name, value string) *corev1ac.EnvVarApplyConfiguration {
		return corev1ac.EnvVar().WithName(name).WithValue(value)
	}
	env := []*corev1ac.EnvVarApplyConfiguration{
		corev1ac.EnvVar().WithName("POD_NAME").WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("metadata.name"))),
		databaseURLEnv(inbox),
	}
	if sasl := inbox.Spec.Kafka.SASL; sasl != nil {
		user := value("SEQINBOX_KAFKA_USERNAME", sasl.Username)
		if sasl.UsernameSecretRef != nil {
			user = corev1ac.EnvVar().WithName("SEQINBOX_KAFKA_USERNAME").WithValueFrom(fromSecret(*sasl.UsernameSecretRef))
		}
		env = append(env, user,
			corev1ac.EnvVar().WithName("SEQINBOX_KAFKA_PASSWORD").WithValueFrom(fromSecret(sasl.PasswordSecretRef)))
	}
	tls := inbox.Spec.Kafka.TLS
	if tls != nil && tls.CASecretRef != nil {
		env = append(env, value("SEQINBOX_KAFKA_CA_FILE", path.Join(configDir, kafkaCAFile)))
	}
	if tls != nil && tls.ClientCertificate != nil {
		env = append(env,
			value("SEQINBOX_KAFKA_CERT_FILE", path.Join(configDir, kafkaCertFile)),
			value("SEQINBOX_KAFKA_KEY_FILE", path.Join(configDir, kafkaKeyFile)))
	}
	for _, f := range sinkFiles(&inbox.Spec.Sink) {
		env = append(env, value(f.env, path.Join(configDir, f.file)))
	}
	// The consumer bounds the bytes of the records it holds by a share of its memory limit. Only a
	// set limit is passed: without one, the downward API would give the node's allocatable memory.
	if _, ok := consumerResources(inbox).Limits[corev1.ResourceMemory]; ok {
		env = append(env, corev1ac.EnvVar().WithName("SEQINBOX_MEMORY_LIMIT").WithValueFrom(corev1ac.EnvVarSource().
			WithResourceFieldRef(corev1ac.ResourceFieldSelector().WithContainerName(consumerContainer).WithResource("limits.memory"))))
	}
	return env
}

// databaseURLEnv hands the database URL from its Secret to the consumer and the Jobs.
func databaseURLEnv(inbox *v1alpha1.SequentialInbox) *corev1ac.EnvVarApplyConfiguration {
	return corev1ac.EnvVar().WithName("SEQINBOX_DATABASE_URL").WithValueFrom(fromSecret(inbox.Spec.Database.URLSecretRef))
}

// fromSecret reads a variable from the Secret key that the spec names.
func fromSecret(ref corev1.SecretKeySelector) *corev1ac.EnvVarSourceApplyConfiguration {
	key := corev1ac.SecretKeySelector().WithName(ref.Name).WithKey(ref.Key)
	if ref.Optional != nil {
		key.WithOptional(*ref.Optional)
	}
	return corev1ac.EnvVarSource().WithSecretKeyRef(key)
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

// resourceRequirements are the requests, limits and claims of r as the container's resources.
func resourceRequirements(r corev1.ResourceRequirements) *corev1ac.ResourceRequirementsApplyConfiguration {
	ac := corev1ac.ResourceRequirements()
	if len(r.Requests) > 0 {
		ac.WithRequests(r.Requests)
	}
	if len(r.Limits) > 0 {
		ac.WithLimits(r.Limits)
	}
	for _, c := range r.Claims {
		claim := corev1ac.ResourceClaim().WithName(c.Name)
		if c.Request != "" {
			claim.WithRequest(c.Request)
		}
		ac.WithClaims(claim)
	}
	return ac
}

// consumerPDB lets voluntary disruptions (node drains) take one consumer at a time.
func consumerPDB(inbox *v1alpha1.SequentialInbox) *policyv1ac.PodDisruptionBudgetApplyConfiguration {
	return policyv1ac.PodDisruptionBudget(pdbName(inbox), inbox.Namespace).
		WithLabels(objectLabels(inbox, componentConsumer)).
		WithSpec(policyv1ac.PodDisruptionBudgetSpec().
			WithMaxUnavailable(intstr.FromInt32(1)).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(inbox, componentConsumer))))
}

// metricsService exposes the consumers' Prometheus metrics.
func metricsService(inbox *v1alpha1.SequentialInbox) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(metricsServiceName(inbox), inbox.Namespace).
		WithLabels(objectLabels(inbox, componentConsumer)).
		WithSpec(corev1ac.ServiceSpec().
			WithSelector(selectorLabels(inbox, componentConsumer)).
			WithPorts(corev1ac.ServicePort().
				WithName("metrics").
				WithPort(metricsPort).
				WithTargetPort(intstr.FromString("metrics")).
				WithProtocol(corev1.ProtocolTCP)))
}
