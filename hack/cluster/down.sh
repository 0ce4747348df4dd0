#!/usr/bin/env bash
# Stops the local cluster and removes what it left on the machine: every process it started, the
# pods' containers, mounts and network namespaces, kube-proxy's and the CNI's iptables rules, the
# bridge, and the cluster state (etcd data, kubelet directory). Certificates, binaries and images
# stay cached. Safe to run when nothing runs.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "$(id -u)" = 0 ] || { log "run as root"; exit 1; }
[ -d "$dir" ] || { log "no cluster in $dir"; exit 0; }

# Delete the workloads first, so that the kubelet tears the sandboxes down (CNI DEL, unmounts).
if running kubelet && running kube-apiserver; then
  timeout 30 "$bin/kubectl" delete deploy,rs,ds,sts,job --all -A --wait=false >/dev/null 2>&1
  timeout 60 "$bin/kubectl" delete pod --all -A --grace-period=1 >/dev/null 2>&1
  for _ in $(seq 1 60); do [ -z "$(ctr tasks ls -q 2>/dev/null)" ] && break; sleep 0.5; done
fi

stop() {
  local f=$dir/pids/$1.pid p
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  if kill "$p" 2>/dev/null; then
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
    log "stopped $1 ($p)"
  fi
  rm -f "$f"
}
for c in kubelet kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd; do stop $c; done

# What the kubelet did not remove: stop the remaining containers and their sandboxes' network.
if [ -S "$CONTAINERD_SOCK" ]; then
  for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
  for c in $(ctr containers ls -q 2>/dev/null); do
    for _ in $(seq 1 20); do ctr tasks delete "$c" >/dev/null 2>&1 && break; ctr tasks ls -q 2>/dev/null | grep -qx "$c" || break; sleep 0.1; done
    ctr containers rm "$c" >/dev/null 2>&1
  done
fi
stop containerd
# containerd-shim processes of this containerd outlive it when their task was not deleted.
for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK"); do kill -9 "$p" 2>/dev/null; done

# Network: kube-proxy's chains, the kubelet's chains, the CNI's masquerade chains, the bridge,
# the network namespaces of the pods.
"$bin/kube-proxy" --cleanup >/dev/null 2>&1
for t in filter nat mangle; do
  for ch in INPUT OUTPUT FORWARD POSTROUTING PREROUTING; do
    iptables -t $t -S $ch 2>/dev/null | grep -E -- '-j (KUBE-|CNI-)' | sed "s/^-A/-D/" | while read -r rule; do
      eval iptables -t $t $rule 2>/dev/null
    done
  done
  for ch in $(iptables -t $t -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/ {print $2}'); do iptables -t $t -F "$ch" 2>/dev/null; done
  for ch in $(iptables -t $t -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/ {print $2}'); do iptables -t $t -X "$ch" 2>/dev/null; done
done
ip link del "$BRIDGE" 2>/dev/null
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/ {print $1}'); do ip netns del "$ns" 2>/dev/null; done

# Mounts under the cluster's directories (volumes, sandbox shm, overlay rootfs), deepest first.
awk -v a="$dir/" -v b="$(dirname "$CONTAINERD_SOCK")/" -v c="$CONTAINERD_ROOT/" -v n="/run/netns/cni-" \
  'index($2, a) == 1 || index($2, b) == 1 || index($2, c) == 1 || index($2, n) == 1 {print $2}' /proc/mounts |
  sort -r | while read -r m; do umount -l "$m" && log "unmounted $m"; done

if [ -f "$dir/ip_forward.before" ]; then
  sysctl -qw net.ipv4.ip_forward="$(cat "$dir/ip_forward.before")" && rm -f "$dir/ip_forward.before"
fi
rm -rf "$dir/etcd-data" "$dir/kubelet" "$dir/cni/ipam" /var/log/pods /var/log/containers
log "down: no process, mount, network namespace or iptables rule of the cluster is left"
