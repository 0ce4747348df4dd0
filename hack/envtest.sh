#!/usr/bin/env bash
# Provides the envtest binaries (kube-apiserver, etcd) and prints the directory that holds them.
#
# Order: $KUBEBUILDER_ASSETS if it holds both binaries; else the cache
# ($SEQINBOX_CACHE, default ~/.cache/seqinbox); else build them from source with the wrapper
# modules under hack/envtest/ (no binary downloads). Progress goes to stderr, the directory to stdout.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${SEQINBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seqinbox}
dir=$cache/envtest/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}

log() { echo "envtest: $*" >&2; }

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  if [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ] && [ -x "$KUBEBUILDER_ASSETS/etcd" ]; then
    echo "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks kube-apiserver or etcd; fix or unset it"
  exit 1
fi

mkdir -p "$dir"
# One builder at a time: parallel test runs wait for the first build instead of repeating it.
exec 9>"$dir/.lock"
flock 9

if [ ! -x "$dir/kube-apiserver" ]; then
  log "building kube-apiserver $K8S_VERSION from source into $dir"
  log "the first build takes about ten minutes on 2 cores; later runs reuse it"
  start=$(date +%s)
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37 -X $pkg.gitTreeState=clean"
  (cd "$here/envtest/kube-apiserver" && go build -ldflags "$ldflags" -o "$dir/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
  mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
  log "kube-apiserver built in $(( $(date +%s) - start ))s"
fi

if [ ! -x "$dir/etcd" ]; then
  log "building etcd $ETCD_VERSION from source into $dir (about one minute)"
  start=$(date +%s)
  (cd "$here/envtest/etcd" && go build -ldflags "-s -w" -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$dir/etcd.tmp" "$dir/etcd"
  log "etcd built in $(( $(date +%s) - start ))s"
fi

echo "$dir"
