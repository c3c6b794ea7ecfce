package esdb_test

// This file takes the place of the suite's containers_test.go when
// eventstore/kurrentdb/kurrenttest/clientsuite runs EventStore-Client-Go's own
// tests against kurrenttest: instead of starting KurrentDB containers with
// testcontainers, it connects to the two test servers whose addresses the
// command passes in KURRENTTEST_EMPTY and KURRENTTEST_POPULATED, insecurely or
// (EVENTSTORE_INSECURE=false) over TLS as admin, as the suite does. It declares
// what the suite's other files use from containers_test.go.

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

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

// GetClient connects to the server as the suite does: insecurely with
// EVENTSTORE_INSECURE=true (the default), else over TLS without verifying the
// certificate, as admin.
func GetClient(t *testing.T, container *Container) *esdb.Client {
	if GetEnvOrDefault("EVENTSTORE_INSECURE", "true") == "true" {
		return CreateClient(fmt.Sprintf("esdb://%s?tls=false", container.Endpoint), t)
	}
	return CreateClient(fmt.Sprintf("esdb://admin:changeit@%s?tlsverifycert=false&tls=true", container.Endpoint), t)
}

func CreateEmptyDatabase(t *testing.T) (*Container, *esdb.Client) {
	return server(t, "KURRENTTEST_EMPTY")
}

// CreatePopulatedDatabase is the server the command seeded with the parts of
// the suite's dataset that cases depend on by count only (not the dataset).
func CreatePopulatedDatabase(t *testing.T) (*Container, *esdb.Client) {
	return server(t, "KURRENTTEST_POPULATED")
}

// server connects to a server and, as the suite does, waits for its admin user
// (not for a leader: the suite waits by creating a persistent subscription,
// which the test server does not model, and it is its only node).
func server(t *testing.T, env string) (*Container, *esdb.Client) {
	addr := os.Getenv(env)
	if addr == "" {
		t.Fatalf("%s is not set: run this suite through eventstore/kurrentdb/kurrenttest/clientsuite", env)
	}
	c := &Container{Endpoint: addr}
	client := GetClient(t, c)
	WaitForAdminToBeAvailable(t, client)
	return c, client
}

// WaitForAdminToBeAvailable is the suite's: it reads the first event of $users.
func WaitForAdminToBeAvailable(t *testing.T, db *esdb.Client) {
	for count := 0; count < 50; count++ {
		ctx, cancel := context.WithTimeout(context.Background(), 1*time.Second)
		t.Logf("[debug] checking if admin user is available...%v/50", count)

		stream, err := db.ReadStream(ctx, "$users", esdb.ReadStreamOptions{}, 1)

		if ctx.Err() != nil {
			t.Log("[debug] request timed out, retrying...")
			cancel()
			time.Sleep(1 * time.Second)
			continue
		}

		if stream != nil {
			_, err = stream.Recv()
			if err == nil {
				t.Log("[debug] admin is available!")
				cancel()
				stream.Close()
				return
			}
		}

		if err != nil {
			if esdbError, ok := esdb.FromError(err); !ok {
				if esdbError.Code() == esdb.ErrorCodeResourceNotFound ||
					esdbError.Code() == esdb.ErrorCodeUnauthenticated ||
					esdbError.Code() == esdb.ErrorCodeDeadlineExceeded ||
					esdbError.Code() == esdb.ErrorUnavailable {
					time.Sleep(1 * time.Second)
					t.Logf("[debug] not available retrying...")
					cancel()
					continue
				}

				t.Fatalf("unexpected error when waiting the admin account to be available: %+v", esdbError)
			}

			t.Fatalf("unexpected error when waiting the admin account to be available: %+v", err)
		}
	}

	t.Fatalf("failed to access admin account in a timely manner")
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
