# Build the one seqinbox binary (operator, consumer, migrator) as a static executable.
FROM golang:1.26 AS builder
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=v0.0.0-dev
ARG COMMIT=unknown
WORKDIR /workspace
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
COPY migrations/ migrations/
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath \
    -ldflags "-s -w -X github.com/seqinbox/seqinbox/internal/version.Version=${VERSION} -X github.com/seqinbox/seqinbox/internal/version.Commit=${COMMIT}" \
    -o seqinbox ./cmd/seqinbox

# Static, non-root runtime image with nothing but the binary. `make image` builds the same image
# without Docker (hack/image): same entrypoint, user, labels and platform.
FROM gcr.io/distroless/static:nonroot
ARG VERSION=v0.0.0-dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="seqinbox" \
      org.opencontainers.image.source="https://github.com/seqinbox/seqinbox" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
WORKDIR /
COPY --from=builder /workspace/seqinbox /seqinbox
USER 65532:65532
ENTRYPOINT ["/seqinbox"]
