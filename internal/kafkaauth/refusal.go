package kafkaauth

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// RefusalWatch is a franz-go hook that notices a broker refusing the client's SASL credentials.
// franz-go retries such connections quietly, and a broker either answers
// SASL_AUTHENTICATION_FAILED or ends the connection in the middle of the exchange, so a client
// that waits for a group join or sees only "EOF" would not know that its password is wrong.
type RefusalWatch struct {
	mu  sync.Mutex
	err error
}

// OnBrokerRead implements kgo.HookBrokerRead: a failed read of a SASL authentication answer is a
// refusal.
func (w *RefusalWatch) OnBrokerRead(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.SASLAuthenticate) || err == nil {
		return
	}
	w.set(fmt.Errorf("broker %s:%d ended the connection during SASL authentication: %w", meta.Host, meta.Port, err))
}

// Note records err when it is a broker's SASL_AUTHENTICATION_FAILED answer; other errors are
// no refusal.
func (w *RefusalWatch) Note(err error) {
	if errors.Is(err, kerr.SaslAuthenticationFailed) {
		w.set(err)
	}
}

func (w *RefusalWatch) set(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = err
}

// ErrRefused is in the chain of an error that Explain wrapped: the brokers refused the client's
// credentials.
var ErrRefused = errors.New("the brokers refused the credentials")

// Explain wraps err with ErrRefused and the refusal when the watch saw one, so that a caller
// that got only "EOF" or a timeout learns why; other errors stay as they are.
func (w *RefusalWatch) Explain(err error) error {
	refused := w.Refused()
	if err == nil || refused == nil {
		return err
	}
	return fmt.Errorf("%w (%w): %w", ErrRefused, refused, err)
}

// Refused returns the last refusal, nil when none was seen since Reset.
func (w *RefusalWatch) Refused() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Reset forgets the refusals, once the client got in (it joined its group, a request answered).
func (w *RefusalWatch) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = nil
}

// Refusal says that the brokers refused spec's credentials, for a readiness message or a
// condition: the mechanism, the user, the Secret key of the password, and what to do.
func Refusal(spec *v1alpha1.KafkaSpec, cause error) string {
	s := spec.SASL
	if s == nil {
		return fmt.Sprintf("the Kafka brokers refused authentication (%s): %v", Describe(spec), cause)
	}
	user := fmt.Sprintf("user %q", s.Username)
	if s.UsernameSecretRef != nil {
		user = fmt.Sprintf("the user of Secret %s key %s", s.UsernameSecretRef.Name, s.UsernameSecretRef.Key)
	}
	return fmt.Sprintf("Kafka authentication failed: the brokers refused SASL %s as %s with the password from Secret %s key %s (%v); "+
		"correct the password in that Secret (or spec.kafka.sasl), then restart the consumers",
		s.Mechanism, user, s.PasswordSecretRef.Name, s.PasswordSecretRef.Key, cause)
}
