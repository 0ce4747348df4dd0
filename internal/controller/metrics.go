package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// inboxCondition exports every inbox's conditions from the operator, so that alerts can watch
// what only the operator knows (a blocked rollout, an invalid spec). It is registered with
// controller-runtime's registry, which the manager serves on its metrics endpoint.
var inboxCondition = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "seqinbox_inbox_condition",
	Help: "1 when the condition of the SequentialInbox has the status, else 0 (one series per status True, False, Unknown).",
}, []string{"namespace", "inbox", "condition", "status"})

func init() {
	metrics.Registry.MustRegister(inboxCondition)
}

// conditionStatuses are the statuses exported per condition.
var conditionStatuses = []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown}

// exportConditions sets inboxCondition from the inbox's status.
func exportConditions(inbox *v1alpha1.SequentialInbox) {
	for _, c := range inbox.Status.Conditions {
		for _, status := range conditionStatuses {
			value := 0.0
			if c.Status == status {
				value = 1
			}
			inboxCondition.WithLabelValues(inbox.Namespace, inbox.Name, c.Type, string(status)).Set(value)
		}
	}
}

// forgetConditions drops the series of an inbox that is gone.
func forgetConditions(inbox *v1alpha1.SequentialInbox) {
	inboxCondition.DeletePartialMatch(prometheus.Labels{"namespace": inbox.Namespace, "inbox": inbox.Name})
}
