package bench

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/platform/embednats"
)

// The echo system answers every command at once with a fixed reply naming its
// key, on an embedded NATS server like the others: no decoding, no storage. Its
// load phase is the ceiling of NATS request-reply for these clients on this
// machine, the most any system behind this front could do.

type echoServer struct {
	natsURL string
	stop    func()
}

func startEcho(dir string) (*echoServer, error) {
	ns, err := embednats.Start(embednats.Options{Addr: "127.0.0.1:0", StoreDir: filepath.Join(dir, "nats-echo"), Name: "bench-echo"})
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.Name("bench-echo"))
	if err != nil {
		ns.Shutdown()
		return nil, err
	}
	keyField := []byte(`"idempotency_key":"`)
	sub, err := nc.QueueSubscribe(natsapi.CommandSubjects, natsapi.DefaultQueueGroup, func(m *nats.Msg) {
		key := m.Data
		if i := bytes.Index(key, keyField); i >= 0 {
			key = key[i+len(keyField):]
			if j := bytes.IndexByte(key, '"'); j >= 0 {
				key = key[:j]
			}
		}
		b := make([]byte, 0, 128)
		b = append(b, `{"status":"applied","code":"ok","message":"","idempotency_key":"`...)
		b = append(b, key...)
		b = append(b, `","duplicate":false,"events":[]}`...)
		_ = m.Respond(b)
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err != nil {
		nc.Close()
		ns.Shutdown()
		return nil, err
	}
	return &echoServer{natsURL: ns.ClientURL(), stop: func() {
		nc.Close()
		shutdown(ns)
	}}, nil
}

func shutdown(ns *server.Server) {
	done := make(chan struct{})
	go func() { ns.Shutdown(); ns.WaitForShutdown(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
}

// runEcho drives the echo system's load phase only (it remembers nothing, so
// resends are not duplicates to it: it gets new commands only).
//
// Its open-loop phases run at the rates of the ledger's (refRate: the ledger's
// load phase, when it ran before; otherwise its own), which shows what the
// clients and NATS alone add to the latency at those rates.
func runEcho(ctx context.Context, cfg Config, natsURL string, w *workload, pm int, prog *progress, refRate float64) ([]PhaseResult, error) {
	t, err := dialTarget(SystemEcho, natsURL, cfg.Clients)
	if err != nil {
		return nil, err
	}
	defer t.close()
	gens := make([]*clientGen, cfg.Clients)
	for i := range gens {
		gens[i] = newClientGen(w, "echo", i)
	}
	if cfg.Warmup > 0 {
		if _, err := drive(ctx, t, gens, loadSpec{system: SystemEcho, phase: "warm-up", duration: cfg.Warmup}, prog); err != nil {
			return nil, err
		}
	}
	before := sampleCPU(pm)
	hook(cfg, SystemEcho, PhaseLoad, true)
	run, err := drive(ctx, t, gens, loadSpec{system: SystemEcho, phase: PhaseLoad, duration: cfg.Duration, record: true}, prog)
	hook(cfg, SystemEcho, PhaseLoad, false)
	if err != nil {
		return nil, err
	}
	res := resultOf(run)
	res.CPU = cpuBetween(before, sampleCPU(pm), cpuCount())
	res.Mode = "closed loop, new commands only; the reply is fixed: NATS request-reply alone"
	out := []PhaseResult{res}
	ref, of := refRate, "the ledger's"
	if ref <= 0 {
		ref, of = res.CommandsPerSec, "its own"
	}
	for _, f := range cfg.OpenLoopFractions {
		rate := ref * f
		name := PhaseHalfLoad
		if f != 0.5 {
			name = fmt.Sprintf("load@%g%%", 100*f)
		}
		if _, err := drive(ctx, t, gens, loadSpec{system: SystemEcho, phase: name + " warm-up", duration: min(time.Second, cfg.Duration/4), rate: rate}, prog); err != nil {
			return out, err
		}
		before := sampleCPU(pm)
		run, err := drive(ctx, t, gens, loadSpec{system: SystemEcho, phase: name, duration: cfg.Duration / 2, rate: rate, record: true}, prog)
		if err != nil {
			return out, err
		}
		r := resultOf(run)
		r.CPU = cpuBetween(before, sampleCPU(pm), cpuCount())
		r.TargetRate = rate
		r.Mode = fmt.Sprintf("open loop at %.0f/s (%g%% of %s load phase), after 1s unrecorded", rate, 100*f, of)
		out = append(out, r)
	}
	return out, nil
}
