#!/usr/bin/env bash
# Builds the kubectl plugin's release archives (kubectl-seqinbox_VERSION_OS_ARCH.tar.gz) for the
# platforms of plugins/krew/seqinbox.yaml into dist/krew, and writes the manifest there with the
# version, the release's download URL (KREW_URL) and each archive's SHA-256 filled in. The release
# step uploads the archives to KREW_URL and submits the manifest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

: "${VERSION:?set VERSION, the release (v0.2.0)}"
: "${KREW_URL:?set KREW_URL, where the release publishes the archives}"
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
out=dist/krew
mkdir -p "$out"
ldflags="-X github.com/seqinbox/seqinbox/internal/version.Version=$VERSION -X github.com/seqinbox/seqinbox/internal/version.Commit=$COMMIT"
manifest=$(sed -e "s|@VERSION@|$VERSION|g" -e "s|@URL@|$KREW_URL|g" plugins/krew/seqinbox.yaml)

for platform in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
  os=${platform%/*} arch=${platform#*/}
  echo "krew: building kubectl-seqinbox for $os/$arch" >&2
  dir=$(mktemp -d)
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "$ldflags" -o "$dir/kubectl-seqinbox" ./cmd/kubectl-seqinbox
  archive=$out/kubectl-seqinbox_${VERSION}_${os}_${arch}.tar.gz
  tar -C "$dir" -czf "$archive" kubectl-seqinbox
  rm -rf "$dir"
  sum=$(sha256sum "$archive" | cut -d' ' -f1)
  key=SHA256_$(echo "${os}_${arch}" | tr '[:lower:]' '[:upper:]')
  manifest=${manifest//@$key@/$sum}
done

if grep -q '@[A-Z0-9_]*@' <<<"$manifest"; then
  echo "krew: placeholders left in the manifest: $(grep -o '@[A-Z0-9_]*@' <<<"$manifest" | sort -u | tr '\n' ' ')" >&2
  exit 1
fi
printf '%s\n' "$manifest" >"$out/seqinbox.yaml"
echo "krew: wrote $out/seqinbox.yaml and its archives" >&2
