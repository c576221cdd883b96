# syntax=docker/dockerfile:1

# The outbox binary: migrate, worker, relay, enqueue, demo, ... (not dev nor bench)
#
#   docker build -t outbox .
#   docker run --rm -e DATABASE_URL=... outbox migrate
#
# The binary is built with the nodev tag from the command's module (cmd/outbox) alone: no
# outbox dev, no outbox bench, and no Temporal server inside: an image of about 40 MB (the
# full binary alone is about 164 MB).
# GO_VERSION must provide Go 1.26.8 or newer (go.mod); GOTOOLCHAIN=local keeps the build
# from downloading another toolchain.
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
ENV GOTOOLCHAIN=local \
    CGO_ENABLED=0 \
    GOWORK=off
WORKDIR /src
# The library's requirements, the command's cobra (its command tree,
# cmd/outbox/internal/cli) and the MySQL store's driver are all that a nodev build needs;
# the store driver, the URL redactor and the trace helpers are modules of this repository
# the others replace.
COPY go.mod go.sum ./
COPY cmd/outbox/go.mod cmd/outbox/go.sum ./cmd/outbox/
COPY store/mysqlstore/go.mod store/mysqlstore/go.sum ./store/mysqlstore/
COPY store/storedriver/go.mod store/storedriver/go.sum ./store/storedriver/
COPY internal/redact/go.mod ./internal/redact/
COPY internal/tracing/go.mod internal/tracing/go.sum ./internal/tracing/
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download && \
    cd cmd/outbox && go mod download github.com/spf13/cobra github.com/spf13/pflag github.com/go-sql-driver/mysql filippo.io/edwards25519
COPY . .
WORKDIR /src/cmd/outbox
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -tags nodev -trimpath -ldflags="-s -w" -o /out/outbox .

# Static binary, no shell, runs as uid 65532 (nonroot).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/outbox /usr/local/bin/outbox
# Numeric, so that Kubernetes can verify runAsNonRoot without a runAsUser: 65532 is the
# base image's nonroot user and group.
USER 65532:65532
ENTRYPOINT ["outbox"]
