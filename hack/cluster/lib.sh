# Shared settings of the local cluster scripts (sourced, not run).
# A single-node Kubernetes v1.37.2 cluster from binaries built from source, containerd, runc and
# the CNI plugins of Debian 12. Everything it writes lives in $SEQINBOX_CACHE (default
# ~/.cache/seqinbox): binaries in kubernetes/, state, certificates and logs in cluster/.

K8S_VERSION=v1.37.2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${SEQINBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seqinbox}
bin=$cache/kubernetes/$K8S_VERSION
dir=$cache/cluster
export KUBECONFIG=$dir/admin.kubeconfig
NODE_NAME=${NODE_NAME:-seqinbox-node}
# The node's address: the source address of the default route, reachable from pods.
NODE_IP=${NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}')}
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
BRIDGE=seqinboxbr0
CNI_NETWORK=seqinbox
PAUSE_IMAGE=seqinbox.local/pause:1
# The containerd of the cluster runs on its own socket and root, so that it never meets another
# containerd of the machine.
CONTAINERD_SOCK=/run/seqinbox-containerd/containerd.sock
CONTAINERD_ROOT=/var/lib/seqinbox-containerd
ctr() { command ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }

log() { echo "cluster: $*" >&2; }

# running NAME: the component's process from its pid file is alive.
running() {
  local f=$dir/pids/$1.pid
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}
