package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/ledgerworks/ledger/internal/adapters/httpapi"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/platform/node"
	"github.com/ledgerworks/ledger/projections"
)

// projectorRunner runs the read side inside a ledger node: the projector on the
// node's event store and database, the events publisher (LEDGER_EVENTS, PROTOCOL.md
// §4.1) on the node's NATS connection, the NATS queries account, entries and transfer
// (command is answered by the node's intake from the event store, which is never
// behind), and the HTTP queries under /v1/ on the node's HTTP server.
// LEDGER_EVENTS is declared with replicas, as the command streams are.
func projectorRunner(replicas int) node.Runner {
	return node.Runner{Name: "projector", Run: func(ctx context.Context, n *node.Node) error {
		if n.DatabaseURL == "" {
			return errors.New("projector: the node has no database URL for the read models")
		}
		pool, err := projections.NewPool(ctx, n.DatabaseURL)
		if err != nil {
			return fmt.Errorf("projector: %w", err)
		}
		defer pool.Close()
		runner, err := projections.NewRunner(pool, n.Store, projections.Options{
			Logger: n.Logger.With("component", "projector"), Metrics: projections.NewMetrics(n.Registry),
		})
		if err != nil {
			return err
		}
		pub, err := projections.NewPublisher(pool, n.Store, n.NC, projections.PublisherOptions{
			Logger: n.Logger.With("component", "publisher"), Registry: n.Registry, Replicas: replicas,
		})
		if err != nil {
			return err
		}
		defer pub.Start(ctx)()
		qlog := n.Logger.With("component", "query")
		svc := query.New(pool, query.Options{Logger: qlog, Metrics: query.NewMetrics(n.Registry)})
		resp, err := natsapi.ServeReadQueries(n.NC, svc, natsapi.ReadQueryOptions{Queries: query.ReadModelQueries, Logger: qlog})
		if err != nil {
			return err
		}
		defer resp.Stop()
		if n.HTTP != nil {
			httpapi.QueryRoutes(n.HTTP, svc)
			n.HTTP.AddCheck("projector", func(ctx context.Context) error {
				_, err := projections.Checkpoints.LiveByName(ctx, pool)
				return err
			})
		}
		return runner.Run(ctx)
	}}
}
