// Package httpapi is the HTTP surface the ledger's programs share: /healthz (the
// process runs), /readyz (its dependencies answer) and Prometheus /metrics, on
// one mux to which a program adds its own routes; the read side's queries
// (QueryRoutes, GET /v1/...); and the HTTP status of every reply code.
package httpapi
