package kurrenttest

import (
	"testing"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
)

// Client connects EventStore-Client-Go to connectionString (a test server's
// ConnectionString, or one naming its users or certificate authority), with
// the client's logging off; the client is closed when t ends.
func Client(t testing.TB, connectionString string) *esdb.Client {
	t.Helper()
	cfg, err := esdb.ParseConnectionString(connectionString)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = esdb.NoopLogging()
	c, err := esdb.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
