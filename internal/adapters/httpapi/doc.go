// Package httpapi is the operational HTTP surface the ledger's programs share:
// /healthz (the process runs), /readyz (its dependencies answer) and Prometheus
// /metrics, on one mux to which a program may add its own routes (the read API).
package httpapi
