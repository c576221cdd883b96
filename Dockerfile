# syntax=docker/dockerfile:1

# The outbox binary: migrate, worker, relay, enqueue, demo, ...
#
#   docker build -t outbox .
#   docker run --rm -e DATABASE_URL=... outbox migrate
#
# GO_VERSION must provide Go 1.26.8 or newer (go.mod); GOTOOLCHAIN=local keeps the build
# from downloading another toolchain.
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
ENV GOTOOLCHAIN=local \
    CGO_ENABLED=0
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/outbox ./cmd/outbox

# Static binary, no shell, runs as uid 65532 (nonroot).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/outbox /usr/local/bin/outbox
USER nonroot:nonroot
ENTRYPOINT ["outbox"]
