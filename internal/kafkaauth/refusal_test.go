package kafkaauth

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	corev1 "k8s.io/api/core/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

func TestRefusalWatchNoticesOnlyRefusedCredentials(t *testing.T) {
	broker := kgo.BrokerMetadata{Host: "kafka-0", Port: 9093}
	tests := []struct {
		name    string
		see     func(w *RefusalWatch)
		refused bool
	}{
		{"SASL_AUTHENTICATION_FAILED answer", func(w *RefusalWatch) {
			w.Note(fmt.Errorf("join group: %w", kerr.SaslAuthenticationFailed))
		}, true},
		{"connection ended during SASL authentication", func(w *RefusalWatch) {
			w.OnBrokerRead(broker, int16(kmsg.SASLAuthenticate), 0, 0, 0, io.EOF)
		}, true},
		{"SASL authentication answered", func(w *RefusalWatch) {
			w.OnBrokerRead(broker, int16(kmsg.SASLAuthenticate), 42, 0, 0, nil)
		}, false},
		{"another request failed", func(w *RefusalWatch) {
			w.OnBrokerRead(broker, int16(kmsg.Metadata), 0, 0, 0, io.EOF)
			w.Note(kerr.CoordinatorNotAvailable)
		}, false},
		{"refused, then got in", func(w *RefusalWatch) {
			w.Note(kerr.SaslAuthenticationFailed)
			w.Reset()
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w RefusalWatch
			tt.see(&w)
			if got := w.Refused(); (got != nil) != tt.refused {
				t.Errorf("Refused() = %v, want refused %v", got, tt.refused)
			}
		})
	}
}

func TestRefusalNamesMechanismUserAndPasswordSecret(t *testing.T) {
	password := corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "orders-user"}, Key: "password"}
	tests := []struct {
		name string
		sasl *v1alpha1.KafkaSASL
		want []string
	}{
		{"user in the spec", &v1alpha1.KafkaSASL{Mechanism: "SCRAM-SHA-512", Username: "orders", PasswordSecretRef: password},
			[]string{"Kafka authentication failed", "SASL SCRAM-SHA-512", `user "orders"`, "password from Secret orders-user key password", "EOF"}},
		{"user from a Secret", &v1alpha1.KafkaSASL{Mechanism: "PLAIN", PasswordSecretRef: password,
			UsernameSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "user"}},
			[]string{"SASL PLAIN", "the user of Secret creds key user", "password from Secret orders-user key password"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Refusal(&v1alpha1.KafkaSpec{SASL: tt.sasl}, errors.New("EOF"))
			for _, want := range tt.want {
				if !strings.Contains(got, want) {
					t.Errorf("Refusal = %q, want it to name %q", got, want)
				}
			}
		})
	}
}

func TestExplainWrapsOnlyTheErrorsOfARefusedClient(t *testing.T) {
	timeout := errors.New("topic metadata: EOF")
	var quiet RefusalWatch
	if got := quiet.Explain(timeout); got.Error() != timeout.Error() || !errors.Is(got, timeout) || errors.Is(got, ErrRefused) {
		t.Errorf("Explain without a refusal = %v, want the error as it is", got)
	}
	var refused RefusalWatch
	refused.OnBrokerRead(kgo.BrokerMetadata{Host: "kafka-0", Port: 9093}, int16(kmsg.SASLAuthenticate), 0, 0, 0, io.EOF)
	got := refused.Explain(timeout)
	if !errors.Is(got, ErrRefused) || !errors.Is(got, timeout) || !strings.Contains(got.Error(), "kafka-0:9093") {
		t.Errorf("Explain after a refusal = %v, want ErrRefused naming the broker, wrapping the error", got)
	}
	if refused.Explain(nil) != nil {
		t.Error("Explain(nil) is not nil")
	}
}
