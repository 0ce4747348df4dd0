#!/usr/bin/env bash
# `make demo` (docs/design.md#development-environment): builds bin/seqinbox-dev (the binary with the development commands,
# -tags dev; the release binary has none), finds or starts PostgreSQL (hack/postgres.sh), and
# runs `seqinbox demo`, which starts an embedded Kafka broker, a temporary database, a demo sink
# and two consumers of the sample SequentialInbox, sends a scenario of out-of-order, duplicated,
# filtered, rejected and poisoned order events, and prints a report with a verdict. Everything it
# starts is stopped and removed at the end, also on Ctrl-C. Extra arguments go to `seqinbox demo`.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${VERSION:-v0.1.0-dev}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "demo: building bin/seqinbox-dev with the development commands (-tags dev; the first build compiles the dependencies: a minute or two)" >&2
go build -trimpath -ldflags "-X github.com/seqinbox/seqinbox/internal/version.Version=$version -X github.com/seqinbox/seqinbox/internal/version.Commit=$commit" \
  -tags dev -o bin/seqinbox-dev ./cmd/seqinbox
echo "demo: finding PostgreSQL (hack/postgres.sh)" >&2
url=$(hack/postgres.sh)
exec bin/seqinbox-dev demo --database-url "$url" "$@"
