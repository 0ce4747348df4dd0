#!/usr/bin/env bash
# Provides the cluster's Kubernetes binaries and prints their directory: kube-apiserver and etcd
# as hack/envtest.sh builds them, kubelet, kube-controller-manager, kube-scheduler, kube-proxy and
# kubectl built from source with the same wrapper module (hack/envtest/kube-apiserver), so they
# share its pinned versions and the Go build cache. No binary downloads.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mkdir -p "$bin"
exec 9>"$bin/.lock"
flock 9

pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37 -X $pkg.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=37"
for b in kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
  [ -x "$bin/$b" ] && continue
  log "building $b $K8S_VERSION from source into $bin"
  start=$(date +%s)
  (cd "$repo/hack/envtest/kube-apiserver" && nice -n 10 go build -ldflags "$ldflags" -o "$bin/$b.tmp" "k8s.io/kubernetes/cmd/$b")
  mv "$bin/$b.tmp" "$bin/$b"
  log "$b built in $(( $(date +%s) - start ))s"
done

# Last, so that a build of the envtest binaries running elsewhere overlaps with the builds above.
envtest=$("$repo/hack/envtest.sh")
for b in kube-apiserver etcd; do
  [ -x "$bin/$b" ] || ln -sf "$envtest/$b" "$bin/$b"
done
echo "$bin"
