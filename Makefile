# seqinbox — operator and consumer runtime for Sequential Inbox Kafka consumers.
# `make demo` shows the product on embedded defaults; `make test` runs every test (with `verify`).

VERSION ?= v0.1.0-dev
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
IMG ?= ghcr.io/seqinbox/seqinbox:$(VERSION)
LDFLAGS := -X github.com/seqinbox/seqinbox/internal/version.Version=$(VERSION) -X github.com/seqinbox/seqinbox/internal/version.Commit=$(COMMIT)

# Developer tools are pinned in hack/tools/go.mod and run through `go tool`, never downloaded.
TOOL := go tool -modfile=hack/tools/go.mod
CONTROLLER_GEN := $(TOOL) controller-gen
GOLANGCI_LINT := $(TOOL) golangci-lint
KUSTOMIZE := $(TOOL) kustomize
CRD_REF_DOCS := $(TOOL) crd-ref-docs

# Test flags: every package under -race; a generous timeout for the first envtest build.
GOTEST_FLAGS ?= -race -count=1 -timeout 30m

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z0-9_-]+:.*?##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: ## Generate the CRD and RBAC manifests from the API types and markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/...;./internal/controller/..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: ## Generate the DeepCopy methods of the API types.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: docs
docs: ## Generate the configuration reference docs/reference.md from the API types (crd-ref-docs, pinned in hack/tools).
	$(CRD_REF_DOCS) --source-path=./api --config=hack/crd-ref-docs/config.yaml --renderer=markdown --output-path=docs/reference.md --log-level=ERROR --max-depth=20 --templates-dir=hack/crd-ref-docs/templates/markdown

.PHONY: fmt
fmt: ## Format the code.
	go fmt ./...

.PHONY: vet
vet: ## Vet the code, with the build tags of the legacy engine, the development commands and the e2e suite too.
	go vet ./...
	go vet -tags legacy ./internal/inbox/
	go vet -tags dev ./cmd/seqinbox/...
	go vet -tags e2e ./test/e2e/

.PHONY: lint
lint: ## Lint with golangci-lint v2 (pinned in hack/tools), also the development commands (-tags dev).
	$(GOLANGCI_LINT) run ./...
	$(GOLANGCI_LINT) run --build-tags dev ./cmd/seqinbox/...

.PHONY: verify
verify: ## Regenerate everything and fail when a generated file is stale or the code is unformatted.
	hack/verify.sh

.PHONY: envtest
envtest: ## Build (once, about ten minutes) or find kube-apiserver and etcd for the tests.
	@hack/envtest.sh >/dev/null

.PHONY: postgres
postgres: ## Find or start the PostgreSQL server the tests use and print its URL.
	@hack/postgres.sh

.PHONY: pgbouncer
pgbouncer: ## Find or start PgBouncer (transaction pooling) in front of that server and print a URL through it.
	@hack/pgbouncer.sh

.PHONY: test
test: verify vet lint envtest ## Run every test against real PostgreSQL, envtest and kfake (includes verify and lint).
	SEQINBOX_TEST_DATABASE_URL="$$(hack/postgres.sh)" KUBEBUILDER_ASSETS="$$(hack/envtest.sh)" \
		go test $(GOTEST_FLAGS) ./...
	$(MAKE) fuzz
	# The legacy engine (claim protocol 0) of the e2e upgrade test delivers racing duplicates twice.
	SEQINBOX_TEST_DATABASE_URL="$$(hack/postgres.sh)" go test -tags legacy $(GOTEST_FLAGS) -run '^TestLegacy' ./internal/inbox/
	@echo "tests of the development commands (demo, dev kafka; built with -tags dev)"
	SEQINBOX_TEST_DATABASE_URL="$$(hack/postgres.sh)" go test $(GOTEST_FLAGS) -tags dev ./cmd/seqinbox/...
	@echo "tests behind PgBouncer in transaction pooling mode (hack/pgbouncer.sh)"
	SEQINBOX_TEST_DATABASE_URL="$$(hack/pgbouncer.sh)" go test $(GOTEST_FLAGS) -run 'BehindAPooler' ./migrations/
	SEQINBOX_TEST_DATABASE_URL="$$(hack/pgbouncer.sh)" go test $(GOTEST_FLAGS) -run 'Racing|Concurrent|Duplicate|Loser|Undersized|OneLeader|LeadsHousekeeping|DatabaseWide' ./internal/inbox/
	# The consumer suite, but for the test that connects as a role of its own, which PgBouncer's user list does not serve.
	SEQINBOX_TEST_DATABASE_URL="$$(hack/pgbouncer.sh)" go test $(GOTEST_FLAGS) -skip 'TestAConsumerRunsWithTheDocumentedPrivilegesOnly' ./internal/consumer/

# FUZZTIME is how long `make fuzz` (and so `make test`) runs each fuzz target beyond its seed
# corpus (testdata/fuzz, which every `go test` run replays).
FUZZTIME ?= 10s

.PHONY: fuzz
fuzz: ## Fuzz record decoding and manifest loading for FUZZTIME each.
	go test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./internal/decode/
	go test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/manifest/

.PHONY: bench
bench: ## Run the benchmarks (engine, consumer, operator) once.
	SEQINBOX_TEST_DATABASE_URL="$$(hack/postgres.sh)" KUBEBUILDER_ASSETS="$$(hack/envtest.sh)" \
		go test -run '^$$' -bench . -benchmem -count=1 -timeout 60m ./...

##@ Build

.PHONY: build
build: ## Build bin/seqinbox and the kubectl plugin bin/kubectl-seqinbox.
	go build -trimpath -ldflags "$(LDFLAGS)" -o bin/seqinbox ./cmd/seqinbox
	go build -trimpath -ldflags "$(LDFLAGS)" -o bin/kubectl-seqinbox ./cmd/kubectl-seqinbox

# KREW_URL is where the release publishes the plugin's archives; `make krew` writes it into the manifest.
KREW_URL ?= https://github.com/seqinbox/seqinbox/releases/download/$(VERSION)

.PHONY: krew
krew: ## Build the kubectl plugin's release archives and fill in the krew manifest, under dist/krew.
	VERSION=$(VERSION) COMMIT=$(COMMIT) KREW_URL=$(KREW_URL) hack/krew.sh

.PHONY: run
run: manifests generate ## Run the operator against the cluster of the current kubeconfig.
	go run -trimpath -ldflags "$(LDFLAGS)" ./cmd/seqinbox operator

.PHONY: demo
demo: ## Run the whole claim engine locally on embedded defaults and print a report.
	hack/demo.sh

.PHONY: docker-build
docker-build: ## Build the container image with Docker (needs a Docker engine).
	@docker info >/dev/null 2>&1 || { echo "docker-build: no Docker engine answers on this machine; build the image where one runs" >&2; exit 1; }
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMG) .

.PHONY: image
image: ## Build the release, dev (-tags dev) and legacy-engine (-tags legacy) images without Docker, as OCI tarballs under ~/.cache/seqinbox/images.
	VERSION=$(VERSION) COMMIT=$(COMMIT) IMG=$(IMG) hack/image.sh

##@ Local cluster and end-to-end tests

.PHONY: cluster-up
cluster-up: ## Start (or check) a single-node Kubernetes cluster on this machine (root; Debian containerd, Kubernetes built from source).
	hack/cluster/up.sh

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and remove every process, mount, network namespace and iptables rule it made.
	hack/cluster/down.sh

.PHONY: e2e
e2e: build-installer ## End-to-end tests on the local cluster (started when it does not run): images, install bundle, real pods.
	SEQINBOX_TEST_DATABASE_URL="$$(hack/postgres.sh)" IMG=$(IMG) VERSION=$(VERSION) COMMIT=$(COMMIT) \
		go test -tags e2e -count=1 -timeout 60m -v ./test/e2e/

.PHONY: build-installer
build-installer: manifests generate ## Write dist/install.yaml: CRDs, RBAC and the operator Deployment.
	mkdir -p dist
	cd config/manager && go tool -modfile=../../hack/tools/go.mod kustomize edit set image seqinbox=$(IMG)
	$(KUSTOMIZE) build config/default > dist/install.yaml
	@echo "wrote dist/install.yaml"
