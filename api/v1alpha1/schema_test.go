package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

var k8s client.Client

// TestMain installs the generated CRD into a real API server (envtest) shared by the tests here.
func TestMain(m *testing.M) {
	env, err := testenv.APIServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		os.Exit(2)
	}
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

// created counts the inboxes built, so that names stay unique when the tests run repeatedly (-count).
var created atomic.Int32

func validInbox(prefix string) *v1alpha1.SequentialInbox {
	name := fmt.Sprintf("%s-%d", prefix, created.Add(1))
	return &v1alpha1.SequentialInbox{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.SequentialInboxSpec{
			Kafka: v1alpha1.KafkaSpec{BootstrapServers: []string{"kafka:9092"}, Topics: []string{"orders"}, ConsumerGroup: name},
			Database: v1alpha1.DatabaseSpec{URLSecretRef: corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "db"}, Key: "url"}},
			Sink: v1alpha1.SinkSpec{URL: "http://orders.default.svc/events"},
			Sequences: []v1alpha1.SequenceSpec{{
				Name: "order", Retention: v1alpha1.Duration{Duration: 3600e9},
				Messages: []v1alpha1.MessageSpec{
					{Type: "OrderCreated"},
					{Type: "OrderShipped", ReleaseCondition: &v1alpha1.ReleaseCondition{And: []v1alpha1.ReleaseConditionTerm{
						{Predecessor: "OrderCreated"},
						{Or: []v1alpha1.ReleaseConditionLeaf{{Predecessor: "OrderPaid"}, {Predecessor: "OrderWaived"}}},
					}}},
				},
			}},
		},
	}
}

func TestCreatedInboxReadsBackWithDefaults(t *testing.T) {
	ctx := context.Background()
	in := validInbox("read-back")
	if err := k8s.Create(ctx, in); err != nil {
		t.Fatalf("create a valid SequentialInbox: %v", err)
	}
	var got v1alpha1.SequentialInbox
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(in), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Kafka.MaxPollIntervalMs != 300000 || got.Spec.Database.PoolSize != 10 ||
		ptr.Deref(got.Spec.Replicas, -1) != 1 || got.Spec.UpgradeStrategy != v1alpha1.UpgradeAutomatic ||
		ptr.Deref(got.Spec.Sink.Retries, -1) != 3 {
		t.Errorf("defaults not applied by the API server: %+v", got.Spec)
	}
	cond := got.Spec.Sequences[0].Messages[1].ReleaseCondition
	if cond == nil || len(cond.And) != 2 || len(cond.And[1].Or) != 2 || cond.And[1].Or[1].Predecessor != "OrderWaived" {
		t.Errorf("nested release condition did not round-trip: %+v", cond)
	}
}

// TestDuplicateProtectionIsKeptAsSetOrLeftUnset: 0s is a valid window (closed instances go at the
// next housekeeping run), and unset stays unset, so that the declaration can default it to the
// retention.
func TestDuplicateProtectionIsKeptAsSetOrLeftUnset(t *testing.T) {
	ctx := context.Background()
	for name, window := range map[string]*v1alpha1.Duration{"protection-zero": {}, "protection-unset": nil} {
		in := validInbox(name)
		in.Spec.Sequences[0].DuplicateProtection = window
		if err := k8s.Create(ctx, in); err != nil {
			t.Fatalf("create with duplicateProtection %v: %v", window, err)
		}
		var got v1alpha1.SequentialInbox
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(in), &got); err != nil {
			t.Fatal(err)
		}
		if back := got.Spec.Sequences[0].DuplicateProtection; (back == nil) != (window == nil) || (back != nil && back.Duration != 0) {
			t.Errorf("%s: duplicateProtection read back as %v, want %v", name, back, window)
		}
	}
}

func TestAPIServerRejectsInvalidInboxes(t *testing.T) {
	cases := map[string]struct {
		mutate func(*v1alpha1.SequentialInbox)
		want   string
	}{
		"no topics":          {func(s *v1alpha1.SequentialInbox) { s.Spec.Kafka.Topics = nil }, "spec.kafka.topics"},
		"pool size of one":   {func(s *v1alpha1.SequentialInbox) { s.Spec.Database.PoolSize = 1 }, "spec.database.poolSize"},
		"sink without http":  {func(s *v1alpha1.SequentialInbox) { s.Spec.Sink.URL = "ftp://x" }, "spec.sink.url"},
		"unknown strategy":   {func(s *v1alpha1.SequentialInbox) { s.Spec.UpgradeStrategy = "Sometimes" }, "spec.upgradeStrategy"},
		"pool over budget":   {func(s *v1alpha1.SequentialInbox) { s.Spec.Database.ConnectionBudget = ptr.To[int32](4) }, "connectionBudget"},
		"subtype, no source": {func(s *v1alpha1.SequentialInbox) { s.Spec.Sequences[0].Messages[0].Subtype = "X" }, "subtypeFrom is required"},
		"condition with predecessor and and": {func(s *v1alpha1.SequentialInbox) {
			s.Spec.Sequences[0].Messages[1].ReleaseCondition.Predecessor = "OrderCreated"
		}, "exactly one of predecessor, and or or"},
		"context id from two places": {func(s *v1alpha1.SequentialInbox) {
			s.Spec.Sequences[0].Messages[0].ContextID = &v1alpha1.FieldSource{Header: "h", Key: true}
		}, "exactly one of header, jsonPointer or key"},
		"buffer bound under a mebibyte": {func(s *v1alpha1.SequentialInbox) {
			s.Spec.Kafka.MaxBufferedBytes = resource.NewQuantity(512<<10, resource.BinarySI)
		}, "spec.kafka.maxBufferedBytes must be at least 1Mi"},
		"dead letters read back": {func(s *v1alpha1.SequentialInbox) { s.Spec.DeadLetterTopic = "orders" }, "spec.deadLetterTopic must not be one of spec.kafka.topics"},
		"retention under a minute": {func(s *v1alpha1.SequentialInbox) {
			s.Spec.Sequences[0].Retention = v1alpha1.Duration{Duration: 59e9}
		}, "spec.sequences[0].retention"},
		"sequence without messages": {func(s *v1alpha1.SequentialInbox) { s.Spec.Sequences[0].Messages = nil }, "spec.sequences[0].messages"},
		"name too long for the Jobs": {func(s *v1alpha1.SequentialInbox) {
			s.Name = "a-name-that-is-longer-than-forty-characters"
		}, "at most 40 characters"},
		"name that is no DNS label": {func(s *v1alpha1.SequentialInbox) { s.Name = "orders.v2" }, "must be a DNS label"},
		"topic with a space":        {func(s *v1alpha1.SequentialInbox) { s.Spec.Kafka.Topics = []string{"my orders"} }, "spec.kafka.topics[0]"},
		"sink URL and Service": {func(s *v1alpha1.SequentialInbox) {
			s.Spec.Sink.Service = &v1alpha1.SinkServiceReference{Name: "orders"}
		}, "set exactly one of spec.sink.url and spec.sink.service"},
		"sink without a destination": {func(s *v1alpha1.SequentialInbox) { s.Spec.Sink.URL = "" }, "set exactly one of spec.sink.url and spec.sink.service"},
		"SASL PLAIN without TLS": {func(s *v1alpha1.SequentialInbox) {
			s.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: "PLAIN", Username: "u",
				PasswordSecretRef: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "u"}, Key: "password"}}
		}, "SASL PLAIN sends the password in clear text"},
		"SASL user name twice": {func(s *v1alpha1.SequentialInbox) {
			s.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: "SCRAM-SHA-512", Username: "u",
				UsernameSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "u"}, Key: "user"},
				PasswordSecretRef: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "u"}, Key: "password"}}
		}, "exactly one of spec.kafka.sasl.username and spec.kafka.sasl.usernameSecretRef"},
	}
	i := 0
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			i++
			in := validInbox(fmt.Sprintf("invalid-%d", i))
			tc.mutate(in)
			err := k8s.Create(context.Background(), in)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create = %v, want an Invalid error", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

func TestConsumerGroupIsImmutable(t *testing.T) {
	ctx := context.Background()
	in := validInbox("immutable-group")
	if err := k8s.Create(ctx, in); err != nil {
		t.Fatal(err)
	}
	in.Spec.Kafka.ConsumerGroup = "another-group"
	err := k8s.Update(ctx, in)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "immutable") {
		t.Fatalf("update of the consumer group = %v, want rejection as immutable", err)
	}
}

// TestAPIServerRefusesInvalidDurationsNamingTheField writes every duration field of the spec as
// text a typed client could not send (unstructured), and out of its bounds.
func TestAPIServerRefusesInvalidDurationsNamingTheField(t *testing.T) {
	fields := [][]string{
		{"database", "idleLockTimeout"}, {"sink", "timeout"}, {"sink", "initialBackoff"},
		{"housekeeping", "interval"}, {"housekeeping", "expiryDelay"}, {"housekeeping", "maxDuration"},
	}
	values := []string{"tenseconds", "10", "-5s", "100000h"}
	for _, f := range fields {
		for _, v := range values {
			path := "spec." + strings.Join(f, ".")
			t.Run(path+"="+v, func(t *testing.T) {
				obj := unstructuredInbox(t, validInbox("duration"))
				if err := unstructured.SetNestedField(obj.Object, v, append([]string{"spec"}, f...)...); err != nil {
					t.Fatal(err)
				}
				err := k8s.Create(context.Background(), obj)
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), path+" must be a duration") {
					t.Fatalf("create with %s %q = %v, want Invalid naming %s", path, v, err, path)
				}
			})
		}
	}
	for _, f := range []string{"retention", "duplicateProtection"} {
		for _, v := range values {
			t.Run(f+"="+v, func(t *testing.T) {
				obj := unstructuredInbox(t, validInbox("duration"))
				sequences, _, _ := unstructured.NestedSlice(obj.Object, "spec", "sequences")
				sequences[0].(map[string]any)[f] = v
				if err := unstructured.SetNestedSlice(obj.Object, sequences, "spec", "sequences"); err != nil {
					t.Fatal(err)
				}
				err := k8s.Create(context.Background(), obj)
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.sequences[0]."+f) {
					t.Fatalf("create with %s %q = %v, want Invalid naming spec.sequences[0].%s", f, v, err, f)
				}
			})
		}
	}
}

// unstructuredInbox renders a typed inbox as the unstructured object a client would send.
func unstructuredInbox(t *testing.T, in *v1alpha1.SequentialInbox) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(in)
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{Object: m}
	obj.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("SequentialInbox"))
	return obj
}

// TestAPIServerTakesTheBufferBoundAsBytesOrQuantity: spec.kafka.maxBufferedBytes is a quantity
// that may be written as a number of bytes too; below 1Mi it is refused in either form.
func TestAPIServerTakesTheBufferBoundAsBytesOrQuantity(t *testing.T) {
	cases := []struct {
		value any
		valid bool
	}{{"64Mi", true}, {int64(2 << 20), true}, {"1Mi", true}, {"1M", false}, {int64(1000), false}, {"0.5Gi", true}}
	for i, tc := range cases {
		t.Run(fmt.Sprint(tc.value), func(t *testing.T) {
			obj := unstructuredInbox(t, validInbox(fmt.Sprintf("buffer-bound-%d", i)))
			if err := unstructured.SetNestedField(obj.Object, tc.value, "spec", "kafka", "maxBufferedBytes"); err != nil {
				t.Fatal(err)
			}
			err := k8s.Create(context.Background(), obj)
			switch {
			case tc.valid && err != nil:
				t.Errorf("create with maxBufferedBytes %v = %v, want accepted", tc.value, err)
			case !tc.valid && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.kafka.maxBufferedBytes must be at least 1Mi")):
				t.Errorf("create with maxBufferedBytes %v = %v, want Invalid naming spec.kafka.maxBufferedBytes", tc.value, err)
			}
		})
	}
}
