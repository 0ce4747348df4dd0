#!/usr/bin/env bash
# Starts the local single-node cluster, or checks that it runs (idempotent). Needs root (it starts
# containerd and the kubelet, and sets up the pod network). Installs containerd, runc and the CNI
# plugins from Debian, builds the Kubernetes binaries and the pause image once (cached), then
# starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and the kubelet.
# Images for the cluster: hack/cluster/load-images.sh TARBALL...; stop everything: down.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$(date +%s.%N)
since() { printf '%.1fs' "$(echo "$(date +%s.%N) - $t0" | bc)"; }
fail() { log "$*"; log "logs: $dir/logs"; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root: the cluster starts containerd, the kubelet and a bridge network"
[ -n "$NODE_IP" ] || fail "no IPv4 default route: set NODE_IP to an address of this machine that pods can reach"

# Debian packages: containerd, runc, the CNI plugins, and what the scripts and kube-proxy run.
missing=()
for p in containerd runc containernetworking-plugins iptables conntrack openssl bc curl ca-certificates; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || fail "apt-get install ${missing[*]} failed; run apt-get update and try again"
fi

"$here/binaries.sh" >/dev/null
mkdir -p "$dir"/{pids,logs,pki,images,cni/net.d,containerd}

# The pause image: the sandbox process of every pod, built from hack/image/pause.
if [ ! -f "$dir/images/pause.tar" ]; then
  (cd "$repo/hack/image" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dir/images/pause" ./pause \
    && go build -o "$dir/images/image" . )
  "$dir/images/image" -binary "$dir/images/pause" -path /pause -ref "$PAUSE_IMAGE" -version 1 -o "$dir/images/pause.tar" >&2
fi

# Certificates: a CA, serving certificates for the API server and the kubelet, a client
# certificate per component, the service-account key pair. Made once per cluster directory.
sign() { # NAME CN O EXTENSIONS
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$2${3:+/O=$3}" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 \
    -extfile <(printf '%b' "$4") 2>/dev/null
  rm -f "$1.csr"
}
if [ ! -f "$dir/pki/sa.pub" ]; then
  log "generating certificates in $dir/pki"
  (
    cd "$dir/pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=seqinbox-local-ca" 2>/dev/null
    client='keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n'
    server='keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n'
    sign apiserver kube-apiserver "" "${server}subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:10.96.0.1,IP:$NODE_IP\n"
    sign kubelet-serving "$NODE_NAME" "" "${server}subjectAltName=DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP\n"
    sign admin kubernetes-admin system:masters "$client"
    sign apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "$client"
    sign kubelet "system:node:$NODE_NAME" system:nodes "$client"
    sign controller-manager system:kube-controller-manager "" "$client"
    sign scheduler system:kube-scheduler "" "$client"
    sign kube-proxy system:kube-proxy "" "$client"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  for n in admin kubelet controller-manager scheduler kube-proxy; do
    cat > "$dir/$n.kubeconfig" <<EOK
apiVersion: v1
kind: Config
clusters:
- name: seqinbox-local
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$dir/pki/ca.crt"}
users:
- name: $n
  user: {client-certificate: "$dir/pki/$n.crt", client-key: "$dir/pki/$n.key"}
contexts:
- name: seqinbox-local
  context: {cluster: seqinbox-local, user: $n}
current-context: seqinbox-local
EOK
  done
fi

# containerd: its own socket and root. restrict_oom_score_adj: without CAP_SYS_RESOURCE (missing
# from the bounding set of some VMs) runc cannot set the sandbox's negative oom_score_adj and
# every pod fails with "can't get final child's PID from pipe"; clamping avoids that.
cat > "$dir/containerd/config.toml" <<EOC
version = 2
root = "$CONTAINERD_ROOT"
state = "$(dirname "$CONTAINERD_SOCK")"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    enable_cdi = false
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$dir/cni/net.d"
      max_conf_num = 1
  [plugins."io.containerd.internal.v1.opt"]
    path = "$CONTAINERD_ROOT/opt"
EOC
cat > "$dir/cni/net.d/10-$CNI_NETWORK.conflist" <<EOC
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "${POD_CIDR%.0/24}.1"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOC
# The kubelet: cgroupfs on a cgroup v1 host without systemd, no eviction on a small disk, local
# images only (they are imported, never pulled).
cat > "$dir/kubelet-config.yaml" <<EOC
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$dir/pki/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$dir/pki/kubelet-serving.crt"
tlsPrivateKeyFile: "$dir/pki/kubelet-serving.key"
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podCIDR: $POD_CIDR
maxPods: 110
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%"}
mergeDefaultEvictionSettings: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusReportFrequency: 10s
syncFrequency: 10s
fileCheckFrequency: 10s
shutdownGracePeriod: 0s
EOC

P=$dir/pki
declare -A cmd
cmd[containerd]="containerd --config $dir/containerd/config.toml"
cmd[etcd]="$bin/etcd --name seqinbox --data-dir $dir/etcd-data --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster seqinbox=http://127.0.0.1:2380 --unsafe-no-fsync --quota-backend-bytes=2147483648 --log-level=warn"
cmd[kube-apiserver]="$bin/kube-apiserver --etcd-servers=http://127.0.0.1:2379 --advertise-address=$NODE_IP --bind-address=0.0.0.0 --secure-port=6443 --tls-cert-file=$P/apiserver.crt --tls-private-key-file=$P/apiserver.key --client-ca-file=$P/ca.crt --kubelet-client-certificate=$P/apiserver-kubelet-client.crt --kubelet-client-key=$P/apiserver-kubelet-client.key --kubelet-preferred-address-types=InternalIP,Hostname --service-account-issuer=https://kubernetes.default.svc.cluster.local --service-account-key-file=$P/sa.pub --service-account-signing-key-file=$P/sa.key --api-audiences=https://kubernetes.default.svc.cluster.local --service-cluster-ip-range=$SERVICE_CIDR --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true --profiling=false --v=1"
cmd[kube-controller-manager]="$bin/kube-controller-manager --kubeconfig=$dir/controller-manager.kubeconfig --authentication-kubeconfig=$dir/controller-manager.kubeconfig --authorization-kubeconfig=$dir/controller-manager.kubeconfig --bind-address=127.0.0.1 --service-account-private-key-file=$P/sa.key --root-ca-file=$P/ca.crt --use-service-account-credentials=true --cluster-signing-cert-file=$P/ca.crt --cluster-signing-key-file=$P/ca.key --allocate-node-cidrs=false --service-cluster-ip-range=$SERVICE_CIDR --leader-elect=false --controllers=*,-node-ipam-controller --v=1"
cmd[kube-scheduler]="$bin/kube-scheduler --kubeconfig=$dir/scheduler.kubeconfig --authentication-kubeconfig=$dir/scheduler.kubeconfig --authorization-kubeconfig=$dir/scheduler.kubeconfig --bind-address=127.0.0.1 --leader-elect=false --v=1"
cmd[kube-proxy]="$bin/kube-proxy --kubeconfig=$dir/kube-proxy.kubeconfig --hostname-override=$NODE_NAME --proxy-mode=iptables --cluster-cidr=10.244.0.0/16 --conntrack-max-per-core=0 --metrics-bind-address=127.0.0.1:10249 --v=1"
cmd[kubelet]="$bin/kubelet --config=$dir/kubelet-config.yaml --kubeconfig=$dir/kubelet.kubeconfig --root-dir=$dir/kubelet --hostname-override=$NODE_NAME --node-ip=$NODE_IP --v=1"

start() {
  if running "$1"; then return; fi
  setsid nohup ${cmd[$1]} >>"$dir/logs/$1.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$1.pid"
  log "started $1 (pid $!), log $dir/logs/$1.log"
}
# wait_for WHAT SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local what=$1 seconds=$2; shift 2
  local deadline=$(( $(date +%s) + seconds ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "$what not reached within ${seconds}s"
    sleep 0.2
  done
  log "$what: +$(since)"
}

# Pods need forwarding; down.sh restores the value the machine had.
[ -f "$dir/ip_forward.before" ] || sysctl -n net.ipv4.ip_forward >"$dir/ip_forward.before"
sysctl -qw net.ipv4.ip_forward=1
modprobe br_netfilter 2>/dev/null || true
sysctl -qw net.bridge.bridge-nf-call-iptables=1 || fail "net.bridge.bridge-nf-call-iptables cannot be set (module br_netfilter)"

start containerd
wait_for "containerd answers" 30 command ctr --address "$CONTAINERD_SOCK" version
ctr images import "$dir/images/pause.tar" >/dev/null
start etcd
wait_for "etcd healthy" 30 curl -sf http://127.0.0.1:2379/health
start kube-apiserver
apiserver_ready() { curl -sf --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" https://127.0.0.1:6443/readyz; }
wait_for "kube-apiserver ready" 120 apiserver_ready
for c in kube-controller-manager kube-scheduler kube-proxy kubelet; do start $c; done
wait_for "node registered" 120 "$bin/kubectl" get node "$NODE_NAME"
wait_for "node Ready" 120 "$bin/kubectl" wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
untainted() { [ -z "$("$bin/kubectl" get node "$NODE_NAME" -o jsonpath='{.spec.taints}')" ]; }
wait_for "node schedulable" 120 untainted
wait_for "default ServiceAccount" 60 "$bin/kubectl" get serviceaccount default

cat >&2 <<EOM
cluster: up (Kubernetes $K8S_VERSION, node $NODE_NAME at $NODE_IP). Point kubectl at it:
  export KUBECONFIG=$KUBECONFIG PATH=$bin:\$PATH
  kubectl get nodes
Load images: hack/cluster/load-images.sh \$(hack/image.sh)   Stop: make cluster-down
EOM
