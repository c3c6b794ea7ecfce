package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ledgerworks/ledger/internal/platform/embednats"
)

// natsServerMain is `chaos nats-server --store DIR --port P`: the embedded
// nats-server (JetStream on disk, fsynced every second as in ledger dev) as a process of its own, so
// that the suite can SIGKILL it and start it again on its store directory.
func natsServerMain(args []string) int {
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	store := fs.String("store", "", "JetStream store directory")
	port := fs.Int("port", 0, "port on 127.0.0.1")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *store == "" || *port == 0 {
		fmt.Fprintln(os.Stderr, "nats-server: --store and --port are required")
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := embednats.Start(embednats.Options{Addr: fmt.Sprintf("127.0.0.1:%d", *port), StoreDir: *store, Name: "chaos", Logger: log})
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
