package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/ledgerworks/ledger/internal/platform/embednats"
)

// natsServerMain is `chaos nats-server --store DIR --port P`: the embedded
// nats-server (JetStream on disk, fsynced every second as in ledger dev) as a process of its own, so
// that the suite can SIGKILL it and start it again on its store directory.
// With --cluster-name it is a node of a JetStream cluster (scenario 13): its
// routes listen on --cluster-addr, it dials --routes, tells the others
// --cluster-advertise, keeps the cluster's client addresses from its clients,
// and serves /jsz on --monitor.
func natsServerMain(args []string) int {
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	store := fs.String("store", "", "JetStream store directory")
	port := fs.Int("port", 0, "port on 127.0.0.1")
	name := fs.String("name", "chaos", "server name")
	clusterName := fs.String("cluster-name", "", "JetStream cluster name (none: a lone server)")
	clusterAddr := fs.String("cluster-addr", "", "host:port the routes listen on")
	advertise := fs.String("cluster-advertise", "", "route address told to the other nodes")
	routes := fs.String("routes", "", "comma-separated nats-route:// URLs to dial")
	monitor := fs.String("monitor", "", "host:port of the HTTP monitoring endpoints")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *store == "" || *port == 0 {
		fmt.Fprintln(os.Stderr, "nats-server: --store and --port are required")
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	o := embednats.Options{Addr: fmt.Sprintf("127.0.0.1:%d", *port), StoreDir: *store, Name: *name, Logger: log,
		ClusterName: *clusterName, ClusterAddr: *clusterAddr, ClusterAdvertise: *advertise, NoAdvertise: *clusterName != "", MonitorAddr: *monitor}
	if *routes != "" {
		o.Routes = strings.Split(*routes, ",")
	}
	s, err := embednats.Start(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "nats-server ready on %s\n", s.ClientURL())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}
