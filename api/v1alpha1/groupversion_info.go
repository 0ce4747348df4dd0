// Package v1alpha1 contains the SequentialInbox API, the one source of truth for a
// sequential inbox declaration (read by the operator and by `seqinbox consume`), and the
// SequentialInboxAction API through which operator actions are requested.
// +kubebuilder:object:generate=true
// +groupName=inbox.seqinbox.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "inbox.seqinbox.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a runtime.Scheme; the package
	// depends only on apimachinery, so that clients import it cheaply.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &SequentialInbox{}, &SequentialInboxList{},
		&SequentialInboxAction{}, &SequentialInboxActionList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
