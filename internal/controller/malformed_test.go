package controller

import (
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// TestAMalformedDurationStoredBeforeItsRuleStopsOnlyItsOwnInbox stores an inbox whose
// spec.sink.timeout is no duration, as an API server without the field's CEL rule (an older
// release of the CRD) accepted it: the test takes the rule out of the installed CRD, creates the
// object, and puts the rule back, so the object stays stored as it was. The operator's manager,
// with its real cache, must still reconcile a valid inbox beside it to Ready, and report the
// stored one as ConfigValid=False naming the field and its value.
func TestAMalformedDurationStoredBeforeItsRuleStopsOnlyItsOwnInbox(t *testing.T) {
	h := newHarness(t)
	withoutTimeoutRule(t, func() {
		typed := &v1alpha1.SequentialInbox{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "legacy"}, Spec: h.validSpec()}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{Object: m}
		obj.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("SequentialInbox"))
		if err := unstructured.SetNestedField(obj.Object, "tenseconds", "spec", "sink", "timeout"); err != nil {
			t.Fatal(err)
		}
		// The API server applies a changed CRD schema shortly after the update.
		deadline := time.Now().Add(time.Minute)
		for {
			err := k8s.Create(h.ctx, obj)
			if err == nil {
				return
			}
			if !apierrors.IsInvalid(err) || time.Now().After(deadline) {
				t.Fatalf("create the inbox with spec.sink.timeout %q without the rule: %v", "tenseconds", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	startManager(t, Options{DefaultImage: imageV1})
	h.create("orders", nil)
	// The valid inbox first: with a decoding that fails on the stored object, the cache never
	// syncs and the controller never reconciles it.
	deadline := time.Now().Add(time.Minute)
	for !meta.IsStatusConditionTrue(h.get("orders").Status.Conditions, v1alpha1.ConditionReady) {
		if time.Now().After(deadline) {
			t.Fatalf("the valid inbox is not Ready after a minute next to the malformed one: %+v", h.get("orders").Status.Conditions)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for meta.FindStatusCondition(h.get("legacy").Status.Conditions, v1alpha1.ConditionConfigValid) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the malformed inbox has no ConfigValid condition after a minute: %+v", h.get("legacy").Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.expectCondition("legacy", v1alpha1.ConditionConfigValid, metav1.ConditionFalse, v1alpha1.InvalidSpecReason,
		"spec.sink.timeout", `"tenseconds"`)
	h.expectCondition("legacy", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.InvalidSpecReason)
	if jobs := h.jobs("legacy", componentProbe); len(jobs) != 0 {
		t.Errorf("the malformed inbox got %d probe Jobs; nothing may run for it", len(jobs))
	}

	// It can be deleted like any other: the finalizer runs although its spec is malformed.
	h.must(k8s.Delete(h.ctx, h.get("legacy")))
	deadline = time.Now().Add(time.Minute)
	for {
		err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "legacy"}, &v1alpha1.SequentialInbox{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the malformed inbox was not deleted: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// withoutTimeoutRule runs create while the installed CRD has no CEL rule on spec.sink.timeout,
// then installs the CRD as it was again.
func withoutTimeoutRule(t *testing.T, create func()) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(testConfig, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Name: "sequentialinboxes." + v1alpha1.GroupVersion.Group}
	edit := func(change func(*apiextensionsv1.CustomResourceDefinitionSpec)) {
		t.Helper()
		for {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := c.Get(t.Context(), key, &crd); err != nil {
				t.Fatal(err)
			}
			change(&crd.Spec)
			err := c.Update(t.Context(), &crd)
			if err == nil {
				return
			}
			if !apierrors.IsConflict(err) {
				t.Fatalf("update CRD %s: %v", key.Name, err)
			}
		}
	}
	var original *apiextensionsv1.CustomResourceDefinitionSpec
	edit(func(spec *apiextensionsv1.CustomResourceDefinitionSpec) {
		original = spec.DeepCopy()
		schema := spec.Versions[0].Schema.OpenAPIV3Schema
		spec2 := schema.Properties["spec"]
		sink := spec2.Properties["sink"]
		timeout := sink.Properties["timeout"]
		if len(timeout.XValidations) == 0 {
			t.Fatal("the installed CRD has no rule on spec.sink.timeout; the test assumes one")
		}
		timeout.XValidations = nil
		sink.Properties["timeout"] = timeout
		spec2.Properties["sink"] = sink
		schema.Properties["spec"] = spec2
	})
	restored := false
	restore := func() {
		if !restored {
			restored = true
			edit(func(spec *apiextensionsv1.CustomResourceDefinitionSpec) { *spec = *original })
		}
	}
	t.Cleanup(restore)
	create()
	restore()
}
