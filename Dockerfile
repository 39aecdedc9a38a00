# cdc-outbox container image: a static binary on distroless, run as non-root.
#
#   docker build -t cdc-outbox \
#     --build-arg VERSION="$(git describe --tags --always --dirty)" \
#     --build-arg REVISION="$(git rev-parse HEAD)" .
#   docker run --rm -p 8080:8080 \
#     -e CDC_OUTBOX_POSTGRES_URL='postgres://app_cdc@db:5432/app' -e PGPASSWORD \
#     -e CDC_OUTBOX_KAFKA_BROKERS=kafka:9092 cdc-outbox
#
# Every flag is also an environment variable (CDC_OUTBOX_<NAME>), or a key of
# a YAML file mounted into the container and named by CDC_OUTBOX_CONFIG. The
# image has no shell and no curl, hence no HEALTHCHECK: probe GET /healthz
# (alive) and GET /readyz (streaming) on port 8080 from the orchestrator.

# Build stage: the Go release the module asks for (go.mod: go 1.26).
FROM golang:1.26-bookworm AS build
WORKDIR /src
# Modules first, so a source change does not download them again. go.mod
# replaces the libraries with their directories here, so their go.mod files
# come too.
COPY go.mod go.sum ./
COPY outbox/go.mod outbox/go.sum outbox/
COPY idempotency/go.mod idempotency/go.sum idempotency/
COPY consume/go.mod consume/go.sum consume/
COPY consume/consumeprom/go.mod consume/consumeprom/go.sum consume/consumeprom/
COPY consume/consumeotel/go.mod consume/consumeotel/go.sum consume/consumeotel/
COPY schema/go.mod schema/go.sum schema/
RUN go mod download
COPY . .
# Empty means: cdc-outbox version prints "dev" and "unknown".
ARG VERSION=
ARG REVISION=
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" \
      -o /out/cdc-outbox ./cmd/cdc-outbox

# Final stage: no shell, no package manager; CA certificates and tzdata for
# TLS to PostgreSQL and Kafka. The nonroot tag runs as uid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=
ARG REVISION=
LABEL org.opencontainers.image.title="cdc-outbox" \
      org.opencontainers.image.description="PostgreSQL outbox table to Kafka through logical replication" \
      org.opencontainers.image.source="https://github.com/cdc-outbox/cdc-outbox" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/cdc-outbox /usr/local/bin/cdc-outbox
USER nonroot:nonroot
# --http-addr (default :8080): /metrics, /healthz, /readyz.
EXPOSE 8080
# SIGTERM drains in-flight events for up to --shutdown-timeout (default 30s):
# give the container longer than that to stop (docker stop -t 40,
# terminationGracePeriodSeconds: 40).
ENTRYPOINT ["cdc-outbox"]
CMD ["run"]
