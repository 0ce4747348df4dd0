package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

func TestSinkSecretsReachTheConsumerAsFiles(t *testing.T) {
	s := renderScope()
	s.inbox.Spec.Sink = v1alpha1.SinkSpec{
		Service: &v1alpha1.SinkServiceReference{Name: "orders", Port: 8443},
		TLS: &v1alpha1.SinkTLS{
			CASecretRef:       &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "orders-ca"}, Key: "ca.crt"},
			ClientCertificate: &v1alpha1.SinkClientCertificate{SecretName: "order-inbox-client"},
		},
		BearerTokenSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "orders-token"}, Key: "token"},
	}
	pod := consumerDeployment(s).Spec.Template.Spec
	env := map[string]string{}
	for _, e := range pod.Containers[0].Env {
		env[ptr.Deref(e.Name, "")] = ptr.Deref(e.Value, "")
	}
	projected := map[string]corev1.KeyToPath{}
	for _, src := range pod.Volumes[0].Projected.Sources {
		if src.Secret != nil {
			item := keyToPath(src.Secret.Items[0])
			projected[ptr.Deref(src.Secret.Name, "")+"/"+item.Key] = item
		}
	}
	want := []struct{ secretKey, file, env string }{
		{"orders-ca/ca.crt", sinkCAFile, "SEQINBOX_SINK_CA_FILE"},
		{"order-inbox-client/tls.crt", sinkCertFile, "SEQINBOX_SINK_CERT_FILE"},
		{"order-inbox-client/tls.key", sinkKeyFile, "SEQINBOX_SINK_KEY_FILE"},
		{"orders-token/token", sinkTokenFile, "SEQINBOX_SINK_TOKEN_FILE"},
	}
	for _, w := range want {
		if got, ok := projected[w.secretKey]; !ok || got.Path != w.file {
			t.Errorf("Secret key %s projected as %+v, want file %s", w.secretKey, got, w.file)
		}
		if got := env[w.env]; got != configDir+"/"+w.file {
			t.Errorf("%s = %q, want %s/%s", w.env, got, configDir, w.file)
		}
	}
}
