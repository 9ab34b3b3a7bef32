# syntax=docker/dockerfile:1
# outbox-cdc container image: a static binary on distroless (CA certificates,
# tzdata, no shell), running as the non-root user 65532.
#
#   docker build -t outbox-cdc --build-arg VERSION=$(git describe --always --dirty) .
#   docker run --rm -e OUTBOX_CDC_POSTGRES_DSN=... -e OUTBOX_CDC_KAFKA_BROKERS=... -p 9187:9187 outbox-cdc
#
# The image's configuration is deploy/outbox-cdc.yaml at
# /etc/outbox-cdc/outbox-cdc.yaml; every key can be overridden with an
# OUTBOX_CDC_<SECTION>_<KEY> environment variable (docs/configuration.md), or
# mount your own file over it.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
# go.mod replaces the library modules with these directories; their go.mod
# files must be there for go mod download.
COPY outbox/go.mod outbox/go.sum ./outbox/
COPY inbox/go.mod inbox/go.sum ./inbox/
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath \
      -ldflags "-s -w -X github.com/outbox-cdc/outbox-cdc/internal/cli.Version=${VERSION}" \
      -o /out/outbox-cdc ./cmd/outbox-cdc

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/outbox-cdc /usr/local/bin/outbox-cdc
COPY deploy/outbox-cdc.yaml /etc/outbox-cdc/outbox-cdc.yaml
USER nonroot:nonroot
# /metrics, /healthz, /readyz (http.listen)
EXPOSE 9187
ENTRYPOINT ["/usr/local/bin/outbox-cdc"]
CMD ["run", "--config", "/etc/outbox-cdc/outbox-cdc.yaml"]
