#!/usr/bin/env bash
# Fails when a generated file (CRDs, RBAC, DeepCopy, the configuration reference) is stale or Go code is unformatted:
# regenerates into the work tree and compares with what was there before. Also fails on a tracked file over 1 MB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

generated=(config/crd/bases config/rbac api/v1alpha1/zz_generated.deepcopy.go docs/reference.md)
before=$(mktemp -d)
trap 'rm -rf "$before"' EXIT
for p in "${generated[@]}"; do
  [ -e "$p" ] && mkdir -p "$before/$(dirname "$p")" && cp -r "$p" "$before/$p"
done

make --no-print-directory manifests generate docs >/dev/null

stale=0
for p in "${generated[@]}"; do
  [ -e "$p" ] || [ -e "$before/$p" ] || continue
  if ! diff -r "$before/$p" "$p" >/dev/null 2>&1; then
    echo "verify: $p is stale; run 'make manifests generate docs' and commit the result:" >&2
    diff -ru "$before/$p" "$p" >&2 || true
    stale=1
  fi
done

unformatted=$(gofmt -l $(find . -name "*.go" -not -path "./.git/*" -not -path "./dist/*" -not -path "./bin/*"))
if [ -n "$unformatted" ]; then
  echo "verify: unformatted Go files (run 'make fmt'):" >&2
  echo "$unformatted" >&2
  stale=1
fi
# A tracked file over 1 MB is a build output or data that belongs elsewhere, never a source.
large=$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$1 > 1048576 {print $2}' || true)
if [ -n "$large" ]; then
  echo "verify: tracked files over 1 MB (remove them with 'git rm --cached' and add them to .gitignore):" >&2
  echo "$large" >&2
  stale=1
fi
exit $stale
