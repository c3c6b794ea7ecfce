package esdb_test

// This file takes the place of the suite's containers_test.go when
// eventstore/kurrentdb/kurrenttest/clientsuite runs EventStore-Client-Go's own
// tests against kurrenttest: instead of starting KurrentDB containers with
// testcontainers, it connects to the two test servers whose addresses the
// command passes in KURRENTTEST_EMPTY and KURRENTTEST_POPULATED. It declares
// what the suite's other files use from containers_test.go.

import (
	"os"
	"testing"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"github.com/goombaio/namegenerator"
)

var NAME_GENERATOR = namegenerator.NewNameGenerator(0)

// Container is a test server started by the command, not a container.
type Container struct {
	Endpoint string
}

// Close leaves the server running: the command stops it after the run.
func (*Container) Close() {}

func GetEnvOrDefault(key, defaultValue string) string {
	if value, exists := os.LookupEnv(key); exists {
		return value
	}
	return defaultValue
}

// IsESDBVersion20 is false: the test server reports 24.10.
func IsESDBVersion20() bool { return false }

// GetClient connects to the server insecurely, as the suite does with
// EVENTSTORE_INSECURE=true (the test server has no TLS and no users).
func GetClient(t *testing.T, container *Container) *esdb.Client {
	return CreateClient("esdb://"+container.Endpoint+"?tls=false", t)
}

func CreateEmptyDatabase(t *testing.T) (*Container, *esdb.Client) {
	return server(t, "KURRENTTEST_EMPTY")
}

// CreatePopulatedDatabase is the server the command seeded with the parts of
// the suite's dataset that cases depend on by count only (not the dataset).
func CreatePopulatedDatabase(t *testing.T) (*Container, *esdb.Client) {
	return server(t, "KURRENTTEST_POPULATED")
}

func server(t *testing.T, env string) (*Container, *esdb.Client) {
	addr := os.Getenv(env)
	if addr == "" {
		t.Fatalf("%s is not set: run this suite through eventstore/kurrentdb/kurrenttest/clientsuite", env)
	}
	c := &Container{Endpoint: addr}
	return c, GetClient(t, c)
}

// WaitForAdminToBeAvailable is only called by the TLS cases, which need a
// secure server with users.
func WaitForAdminToBeAvailable(t *testing.T, db *esdb.Client) {
	t.Fatal("the test server has no admin user")
}

func CreateClient(connStr string, t *testing.T) *esdb.Client {
	config, err := esdb.ParseConnectionString(connStr)
	if err != nil {
		t.Fatalf("Error when parsing connection string: %v", err)
	}
	client, err := esdb.NewClient(config)
	if err != nil {
		t.Fatalf("Error when creating an ESDB client: %v", err)
	}
	return client
}
