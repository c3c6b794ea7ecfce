# syntax=docker/dockerfile:1
# The ledger's two programs, `ledger` and `projector`, in one small image.
# docker-compose.yml builds it once and runs `ledger serve` and `projector run`.

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/ledger ./cmd/ledger && \
    go build -trimpath -ldflags="-s -w" -o /out/projector ./cmd/projector

# Alpine rather than distroless: its busybox wget serves the healthchecks.
FROM alpine:3.21
RUN apk add --no-cache ca-certificates tzdata && adduser -D -u 10001 ledger
COPY --from=build /out/ledger /out/projector /usr/local/bin/
USER ledger
WORKDIR /home/ledger
ENV LEDGER_HTTP_ADDR=0.0.0.0:8080
EXPOSE 8080
CMD ["ledger", "--help"]
