#!/usr/bin/env bash
# Imports image tarballs (OCI layout or docker archive) into the cluster's containerd, where the
# kubelet finds them without a registry: load-images.sh $(hack/image.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
running containerd || { log "the cluster's containerd does not run: make cluster-up"; exit 1; }
for t in "$@"; do
  ctr images import --all-platforms "$t" | sed 's/^/cluster: imported /' >&2
done
