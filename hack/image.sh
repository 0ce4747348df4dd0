#!/usr/bin/env bash
# Builds the seqinbox images without a Docker engine or a registry, as OCI image layout tarballs
# under the cache ($SEQINBOX_CACHE, default ~/.cache/seqinbox, in images/), with hack/image
# (go-containerregistry): one layer with the static binary, /etc/passwd for the non-root user
# 65532 and the CA certificates of the Debian package ca-certificates.
#
#   release  $IMG                 the product: no development code
#   dev      $IMG_DEV             built with -tags dev: adds `seqinbox dev kafka` (kfake), the e2e broker
#   legacy   $IMG_LEGACY          built with -tags legacy: claim protocol 0 (check-then-insert),
#                                 the old engine of the e2e upgrade test; never released
#
# Usage: hack/image.sh [release|dev|legacy ...]   (default: all three). Prints the tarballs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=${VERSION:-v0.1.0-dev}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
IMG=${IMG:-ghcr.io/seqinbox/seqinbox:$VERSION}
IMG_DEV=${IMG_DEV:-ghcr.io/seqinbox/seqinbox-dev:$VERSION}
IMG_LEGACY=${IMG_LEGACY:-ghcr.io/seqinbox/seqinbox-legacy:$VERSION}
LEGACY_VERSION=${LEGACY_VERSION:-v0.0.0-legacy}
cache=${SEQINBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seqinbox}
out=$cache/images
mkdir -p "$out"

log() { echo "image: $*" >&2; }

if [ ! -r /etc/ssl/certs/ca-certificates.crt ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing the Debian package ca-certificates (the image's CA bundle)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ca-certificates >&2
  else
    log "no /etc/ssl/certs/ca-certificates.crt: install the package ca-certificates"
    exit 1
  fi
fi

tool=$out/bin/image
(cd hack/image && go build -o "$tool" .)

# build KIND TAGS ENGINE_VERSION REF
build() {
  local kind=$1 tags=$2 version=$3 ref=$4 start
  start=$(date +%s)
  local pkg=github.com/seqinbox/seqinbox/internal/version
  CGO_ENABLED=0 GOOS=linux GOARCH=amd64 nice -n 10 go build -trimpath -tags "$tags" \
    -ldflags "-s -w -X $pkg.Version=$version -X $pkg.Commit=$COMMIT" -o "$out/seqinbox-$kind" ./cmd/seqinbox
  "$tool" -binary "$out/seqinbox-$kind" -ref "$ref" -version "$version" -revision "$COMMIT" \
    -o "$out/seqinbox-$kind.tar" >&2
  log "$kind image $ref built in $(( $(date +%s) - start ))s"
  echo "$out/seqinbox-$kind.tar"
}

for kind in "${@:-release dev legacy}"; do
  for k in $kind; do
    case $k in
      release) build release "" "$VERSION" "$IMG" ;;
      dev) build dev dev "$VERSION" "$IMG_DEV" ;;
      legacy) build legacy legacy "$LEGACY_VERSION" "$IMG_LEGACY" ;;
      *) log "unknown image $k (release, dev or legacy)"; exit 2 ;;
    esac
  done
done
