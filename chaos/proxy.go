package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy modes.
const (
	modePass      = iota
	modeLatency   // every chunk is delayed
	modeBlackhole // bytes are held back: the peers hang until the heal or their timeouts
	modeReset     // connections are closed, new ones refused
)

var modeNames = []string{"pass", "latency", "blackhole", "reset"}

// proxy is a loopback TCP proxy whose links the suite can degrade or cut.
type proxy struct {
	name    string
	target  string
	ln      net.Listener
	mode    atomic.Int32
	latency atomic.Int64 // nanoseconds
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	faults  atomic.Int64
}

func newProxy(name, target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{name: name, target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) close() {
	p.ln.Close()
	p.cutAll()
}

func (p *proxy) cutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

// set switches the mode; reset also cuts every open connection.
func (p *proxy) set(mode int, latency time.Duration) {
	p.latency.Store(int64(latency))
	p.mode.Store(int32(mode))
	if mode != modePass {
		p.faults.Add(1)
	}
	if mode == modeReset {
		p.cutAll()
	}
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.mode.Load() == modeReset {
			c.Close()
			continue
		}
		go p.link(c)
	}
}

func (p *proxy) link(c net.Conn) {
	u, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.track(c, true)
	p.track(u, true)
	done := make(chan struct{}, 2)
	go p.pipe(u, c, done)
	go p.pipe(c, u, done)
	<-done
	c.Close()
	u.Close()
	<-done
	p.track(c, false)
	p.track(u, false)
}

func (p *proxy) pipe(dst, src net.Conn, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			// A blackhole holds the bytes back, as a network that drops packets
			// does while TCP retransmits them: they arrive after the heal, or the
			// peers give up on their own timeouts. (Swallowing them would corrupt
			// the protocol streams, which no real partition does.)
			for i := 0; i < 6000 && p.mode.Load() == modeBlackhole; i++ { // bounded: 60 s
				time.Sleep(10 * time.Millisecond)
			}
			switch p.mode.Load() {
			case modeLatency:
				time.Sleep(time.Duration(p.latency.Load()))
			case modeReset:
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

// scenarioPartitions puts proxies between the services and NATS and between the
// services and PostgreSQL, and cycles them through latency, blackhole and reset.
func scenarioPartitions(ctx context.Context, s *suite, res *result) error {
	rng := s.rng("7")
	var proxies []*proxy
	defer func() {
		for _, p := range proxies {
			p.close()
		}
	}()
	return runBank(ctx, s, res, bank{
		ledgers: 2, projectors: 1, accounts: 20, producers: 6, commands: s.size(2000, 200),
		resend: 0.05, js: 0.2, retries: 15, timeout: 3 * time.Second,
		ledgerArgs: []string{"--jetstream-backoff", "2s,2s,4s", "--jetstream-grace", "300ms", "--command-timeout", "5s"},
		required:   true, planned: true,
		setup: func(ctx context.Context, sys *system) error {
			np, err := newProxy("nats", fmt.Sprintf("127.0.0.1:%d", sys.natsPort))
			if err != nil {
				return err
			}
			pp, err := newProxy("postgres", fmt.Sprintf("127.0.0.1:%d", s.pgPort))
			if err != nil {
				return err
			}
			proxies = append(proxies, np, pp)
			sys.svcNATSURL = "nats://" + np.addr()
			sys.svcDBURL = strings.Replace(sys.dbURL, fmt.Sprintf("127.0.0.1:%d", s.pgPort), pp.addr(), 1)
			return nil
		},
		faults: func(ctx context.Context, sys *system, res *result) {
			for i := 0; i < s.size(12, 4) && ctx.Err() == nil; i++ {
				if !sleepCtx(ctx, between(rng, 500*time.Millisecond, 1500*time.Millisecond)) {
					return
				}
				p := proxies[rng.IntN(len(proxies))]
				mode := 1 + rng.IntN(3)
				lat := between(rng, 20*time.Millisecond, 200*time.Millisecond)
				p.set(mode, lat)
				s.logf("proxy %s: %s", p.name, modeNames[mode])
				sleepCtx(ctx, between(rng, 500*time.Millisecond, 2*time.Second))
				p.set(modePass, 0)
			}
		},
		evidence: func(_ context.Context, _ *system, res *result) {
			var parts []string
			for _, p := range proxies {
				res.ev.Other += int(p.faults.Load())
				parts = append(parts, fmt.Sprintf("%s %d", p.name, p.faults.Load()))
			}
			res.note("link faults: %s", strings.Join(parts, ", "))
		},
	})
}

var _ = rand.IntN
