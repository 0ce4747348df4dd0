// KEDA, pinned for test/keda only: its module holds the CRDs (config/crd/bases) that the test
// loads into envtest to validate config/samples/keda_scaledobject_order-inbox.yaml. A module of its
// own, so nothing of KEDA is linked into seqinbox; `go mod download` fetches it by this version.
module github.com/seqinbox/seqinbox/hack/keda

go 1.26.0

require github.com/kedacore/keda/v2 v2.21.0
