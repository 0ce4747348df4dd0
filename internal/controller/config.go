package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// configKey is the file of the rendered configuration, mounted at configPath in the consumer.
const (
	configKey  = "inbox.yaml"
	configDir  = "/etc/seqinbox"
	configPath = configDir + "/" + configKey
)

// renderConfig writes the engine configuration — the SequentialInbox manifest that
// `seqinbox consume -f` reads — into an immutable ConfigMap named after its content hash. The hash
// also goes on the pod template, so a new configuration rolls the consumers, and a configuration
// that the gate holds back never reaches running pods (their ConfigMap does not change).
func (r *Reconciler) renderConfig(ctx context.Context, s *scope) (phaseResult, error) {
	data, err := renderManifest(s.inbox)
	if err != nil {
		return proceed, err
	}
	s.configHash = fullHash(data)
	s.configMap = configMapName(s.inbox, s.configHash)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.configMap, Namespace: s.inbox.Namespace,
			Labels:      objectLabels(s.inbox, componentConsumer),
			Annotations: map[string]string{annotationConfigHash: s.configHash},
		},
		Immutable: ptr.To(true),
		Data:      map[string]string{configKey: string(data)},
	}
	if err := controllerutil.SetControllerReference(s.inbox, cm, r.Client.Scheme()); err != nil {
		return proceed, fmt.Errorf("own configmap %s: %w", cm.Name, err)
	}
	var existing corev1.ConfigMap
	err = r.Client.Get(ctx, client.ObjectKeyFromObject(cm), &existing)
	if apierrors.IsNotFound(err) {
		err = r.Client.Create(ctx, cm)
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	}
	if err != nil {
		return proceed, fmt.Errorf("configmap %s: %w", cm.Name, err)
	}
	s.inbox.Status.ConfigHash = s.configHash
	return proceed, nil
}

// manifestDocument is the inbox as a standalone manifest: what a user would apply, without the
// server's metadata and status.
type manifestDocument struct {
	APIVersion string                       `json:"apiVersion"`
	Kind       string                       `json:"kind"`
	Metadata   manifestMetadata             `json:"metadata"`
	Spec       v1alpha1.SequentialInboxSpec `json:"spec"`
}

type manifestMetadata struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

// renderManifest renders the inbox as the YAML that `seqinbox consume -f` reads. The replica
// count is left out: a consumer does not read it, and scaling must not roll the consumers.
func renderManifest(inbox *v1alpha1.SequentialInbox) ([]byte, error) {
	spec := *inbox.Spec.DeepCopy()
	spec.Replicas = nil
	data, err := yaml.Marshal(manifestDocument{
		APIVersion: v1alpha1.GroupVersion.String(),
		Kind:       "SequentialInbox",
		Metadata:   manifestMetadata{Name: inbox.Name, Namespace: inbox.Namespace},
		Spec:       spec,
	})
	if err != nil {
		return nil, fmt.Errorf("render manifest of %s: %w", inbox.Name, err)
	}
	return data, nil
}

// deleteStaleConfigMaps removes rendered configurations other than the current one, once no
// pod of an older template can need them.
func (r *Reconciler) deleteStaleConfigMaps(ctx context.Context, s *scope) error {
	var cms corev1.ConfigMapList
	if err := r.Client.List(ctx, &cms, client.InNamespace(s.inbox.Namespace),
		client.MatchingLabels(selectorLabels(s.inbox, componentConsumer))); err != nil {
		return fmt.Errorf("list configmaps: %w", err)
	}
	for i := range cms.Items {
		cm := &cms.Items[i]
		if cm.Name == s.configMap || !metav1.IsControlledBy(cm, s.inbox) {
			continue
		}
		if err := r.Client.Delete(ctx, cm); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete stale configmap %s: %w", cm.Name, err)
		}
	}
	return nil
}
