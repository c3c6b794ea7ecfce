package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/freeport"
	"github.com/ledgerworks/ledger/projections"
)

// ---- scenario 13: a 3-node JetStream cluster, its leaders SIGKILLed, a node cut off ----

// natsCluster is a JetStream cluster of `chaos nats-server` processes on
// loopback. The ledgers and projectors reach node i through a client proxy,
// and the nodes reach each other through one proxy per route (node a dials
// node b through routes[b]; a node's advertised route address is a closed
// port, so that no route bypasses the proxies): cutting node k resets its
// client proxy and every route proxy to or from it. The suite's own
// client and checker connect to the nodes directly.
type natsCluster struct {
	nodes []*natsNode
}

type natsNode struct {
	name                               string
	clientPort, routePort, monitorPort int
	proc                               *proc
	client                             *proxy
	routes                             map[int]*proxy // to node b
}

func newNATSCluster(sys *system, n int) (*natsCluster, error) {
	c := &natsCluster{}
	closed, err := freeport.Loopback() // advertised by every node: nothing listens there
	if err != nil {
		return nil, err
	}
	for i := range n {
		nd := &natsNode{name: fmt.Sprintf("n%d", i), routes: map[int]*proxy{}}
		for _, p := range []*int{&nd.clientPort, &nd.routePort, &nd.monitorPort} {
			if *p, err = freeport.Loopback(); err != nil {
				return nil, err
			}
		}
		if nd.client, err = newProxy(nd.name+"-client", fmt.Sprintf("127.0.0.1:%d", nd.clientPort)); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, nd)
	}
	for i, nd := range c.nodes {
		var routes []string
		for b := range c.nodes {
			if b == i {
				continue
			}
			if nd.routes[b], err = newProxy(fmt.Sprintf("route-%d-%d", i, b), fmt.Sprintf("127.0.0.1:%d", c.nodes[b].routePort)); err != nil {
				return nil, err
			}
			routes = append(routes, "nats-route://"+nd.routes[b].addr())
		}
		args := []string{"nats-server", "--store", filepath.Join(sys.dir, "nats-"+nd.name), "--port", strconv.Itoa(nd.clientPort),
			"--name", nd.name, "--cluster-name", "chaos", "--cluster-addr", fmt.Sprintf("127.0.0.1:%d", nd.routePort),
			"--cluster-advertise", fmt.Sprintf("127.0.0.1:%d", closed), "--monitor", fmt.Sprintf("127.0.0.1:%d", nd.monitorPort)}
		if len(routes) > 0 {
			args = append(args, "--routes", strings.Join(routes, ","))
		}
		nd.proc = &proc{name: "nats-" + nd.name, bin: sys.s.self, args: args, log: filepath.Join(sys.dir, "nats-"+nd.name+".log")}
	}
	return c, nil
}

// proxyURL is the services' NATS URL: every node through its client proxy.
func (c *natsCluster) proxyURL() string {
	urls := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		urls[i] = "nats://" + nd.client.addr()
	}
	return strings.Join(urls, ",")
}

// directURL is the suite's own NATS URL: every node directly.
func (c *natsCluster) directURL() string {
	urls := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", nd.clientPort)
	}
	return strings.Join(urls, ",")
}

// start starts the nodes that do not run and waits until the cluster is whole.
func (c *natsCluster) start(ctx context.Context) error {
	for _, nd := range c.nodes {
		if err := c.startNode(ctx, nd); err != nil {
			return err
		}
	}
	return c.waitWhole(ctx, nil)
}

func (c *natsCluster) startNode(ctx context.Context, nd *natsNode) error {
	if nd.proc.running() {
		return nil
	}
	if err := nd.proc.start(); err != nil {
		return err
	}
	return waitTCP(ctx, fmt.Sprintf("127.0.0.1:%d", nd.clientPort), 30*time.Second)
}

func (c *natsCluster) stop() {
	for _, nd := range c.nodes {
		nd.proc.stop(5 * time.Second)
		nd.client.close()
		for _, p := range nd.routes {
			p.close()
		}
	}
}

// running reports whether every node runs.
func (c *natsCluster) running() bool {
	for _, nd := range c.nodes {
		if !nd.proc.running() {
			return false
		}
	}
	return true
}

// setCut resets (cut) or passes (heal) node k's client proxy and every route
// proxy to or from it.
func (c *natsCluster) setCut(k int, cut bool) {
	mode := modePass
	if cut {
		mode = modeReset
	}
	c.nodes[k].client.set(mode, 0)
	for i, nd := range c.nodes {
		for b, p := range nd.routes {
			if i == k || b == k {
				p.set(mode, 0)
			}
		}
	}
}

// metaLeader is the node every running node names as the JetStream meta
// leader (by /jsz), -1 while they do not agree or name none.
func (c *natsCluster) metaLeader(ctx context.Context) int {
	leader := ""
	for _, nd := range c.nodes {
		if !nd.proc.running() {
			continue
		}
		l, err := nd.jszLeader(ctx)
		if err != nil || l == "" || (leader != "" && l != leader) {
			return -1
		}
		leader = l
	}
	return c.index(leader)
}

func (c *natsCluster) index(name string) int {
	for i, nd := range c.nodes {
		if nd.name == name {
			return i
		}
	}
	return -1
}

// monitor reads one of the node's monitoring endpoints (/jsz, /routez) into v.
func (nd *natsNode) monitor(ctx context.Context, path string, v any) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", nd.monitorPort, path), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

func (nd *natsNode) jszLeader(ctx context.Context) (string, error) {
	var jsz struct {
		Meta struct {
			Leader string `json:"leader"`
		} `json:"meta_cluster"`
	}
	err := nd.monitor(ctx, "/jsz", &jsz)
	return jsz.Meta.Leader, err
}

// routeCount is the number of routes the node has to the others.
func (nd *natsNode) routeCount(ctx context.Context) (int, error) {
	var routez struct {
		NumRoutes int `json:"num_routes"`
	}
	err := nd.monitor(ctx, "/routez", &routez)
	return routez.NumRoutes, err
}

// clusteredStreams are the streams scenario 13 kills the leaders of and waits on.
var clusteredStreams = []string{natsapi.StreamName, natsapi.DLQStreamName, projections.EventsStream}

// streamLeader is the node leading stream's replicas, -1 when it has none
// now; whole reports whether every replica is current.
func (c *natsCluster) streamLeader(ctx context.Context, js jetstream.JetStream, stream string) (leader int, whole bool) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := js.Stream(sctx, stream)
	if err != nil {
		return -1, false
	}
	info := st.CachedInfo()
	if info.Cluster == nil {
		return -1, false
	}
	whole = len(info.Cluster.Replicas) == len(c.nodes)-1
	for _, r := range info.Cluster.Replicas {
		whole = whole && r.Current && !r.Offline
	}
	return c.index(info.Cluster.Leader), whole
}

// waitWhole waits (bounded) until the nodes agree on a meta leader and, with
// js, every clustered stream that exists has a leader and all its replicas
// current.
func (c *natsCluster) waitWhole(ctx context.Context, js jetstream.JetStream) error {
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := c.whole(ctx, js)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("NATS cluster not whole after 90s: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *natsCluster) whole(ctx context.Context, js jetstream.JetStream) error {
	if !c.running() {
		return errors.New("a node is down")
	}
	if c.metaLeader(ctx) < 0 {
		return errors.New("no meta leader every node names")
	}
	if js == nil {
		return nil
	}
	for _, name := range clusteredStreams {
		if l, whole := c.streamLeader(ctx, js, name); l < 0 || !whole {
			return fmt.Errorf("%s: leader %d, every replica current: %v", name, l, whole)
		}
	}
	return nil
}

// killLeader SIGKILLs the node leader() names, waits until leader() names
// another node (the leader change, C8's evidence), then starts the node again
// on its store and waits until the cluster is whole. It returns the time from
// the kill to the new leader, and to whole.
func (c *natsCluster) killLeader(ctx context.Context, sys *system, js jetstream.JetStream, leader func() int) (elected, whole time.Duration, err error) {
	var k int
	if err := pollUntil(ctx, 30*time.Second, func() bool { k = leader(); return k >= 0 }); err != nil {
		return 0, 0, errors.New("no leader to kill")
	}
	nd := c.nodes[k]
	began := time.Now()
	nd.proc.kill()
	sys.kills.Add(1)
	if err := pollUntil(ctx, 60*time.Second, func() bool { l := leader(); return l >= 0 && l != k }); err != nil {
		return 0, 0, fmt.Errorf("no leader but %s within 60s of its SIGKILL", nd.name)
	}
	elected = time.Since(began)
	if err := c.startNode(ctx, nd); err != nil {
		return 0, 0, err
	}
	if err := c.waitWhole(ctx, js); err != nil {
		return 0, 0, err
	}
	return elected, time.Since(began), nil
}

// pollUntil polls cond every 50 ms until it holds, or fails after timeout.
func pollUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || !sleepCtx(ctx, 50*time.Millisecond) {
			return errors.New("timed out")
		}
	}
	return nil
}

// scenarioNATSCluster runs the bank workload with two ledgers and two
// projectors on a 3-node JetStream cluster of processes, every stream at 3
// replicas, and SIGKILLs in turn the node leading the JetStream meta group,
// LEDGER_COMMANDS' leader and LEDGER_EVENTS' leader, each started again on its
// store once another node leads; then cuts one node off (its client and route
// proxies reset) for a few seconds. C1-C9 on the store and LEDGER_EVENTS; C8
// demands each fault seen: a leader change after each kill, the cut node
// without a route.
func scenarioNATSCluster(ctx context.Context, s *suite, res *result) error {
	nf := &natsFaults{s: s, rng: s.rng("13")}
	err := runBank(ctx, s, res, bank{
		ledgers: 2, projectors: 2, accounts: 20, producers: 6, commands: s.size(2500, 400),
		resend: 0.05, js: 0.3, retries: 15, timeout: 4 * time.Second,
		ledgerArgs: []string{"--jetstream-backoff", "2s,2s,4s", "--jetstream-grace", "300ms"},
		required:   true, planned: true, loadFor: s.durScale(75*time.Second, 120*time.Second),
		evidence: stopLedgersFirst,
		setup:    setUpNATSCluster,
		faults:   nf.faults,
	})
	if err == nil && res.report != nil && nf.changes < 4 {
		res.report.fail(8, "%d of 4 faults seen (a leader change after each of 3 SIGKILLs: meta, %s, %s; a node without routes)", nf.changes, natsapi.StreamName, projections.EventsStream)
	}
	return err
}

// setUpNATSCluster starts the 3-node cluster and points the services at its
// proxies, every stream at 3 replicas.
func setUpNATSCluster(ctx context.Context, sys *system) error {
	c, err := newNATSCluster(sys, 3)
	if err != nil {
		return err
	}
	sys.cluster = c
	sys.svcNATSURL = c.proxyURL()
	sys.svcEnv = []string{config.EnvJetStreamReplicas + "=3"}
	return nil
}

// natsFaults is scenario 13's faults and the faults seen (changes).
type natsFaults struct {
	s       *suite
	rng     *rand.Rand
	changes int
}

// faults kills the leaders in turn, then cuts a node off.
func (nf *natsFaults) faults(ctx context.Context, sys *system, res *result) {
	c := sys.cluster
	js, err := jetstream.New(sys.nc)
	if err != nil {
		res.note("jetstream: %v", err)
		return
	}
	bg := context.WithoutCancel(ctx)
	if err := c.waitWhole(bg, js); err != nil {
		res.note("before the faults: %v", err)
		return
	}
	if !nf.killLeaders(ctx, bg, sys, js, res) {
		return
	}
	if !sleepCtx(ctx, between(nf.rng, 2*time.Second, 3*time.Second)) {
		return
	}
	nf.cutNode(bg, c, js, res)
}

// killLeaders SIGKILLs in turn the meta leader and the two streams' leaders,
// each after a pause, and waits for another leader and the whole cluster
// each time; false when ctx ended or a kill failed.
func (nf *natsFaults) killLeaders(ctx, bg context.Context, sys *system, js jetstream.JetStream, res *result) bool {
	c, s := sys.cluster, nf.s
	leaders := []struct {
		what   string
		leader func() int
	}{
		{"the JetStream meta leader", func() int { return c.metaLeader(bg) }},
		{natsapi.StreamName + "'s leader", func() int { l, _ := c.streamLeader(bg, js, natsapi.StreamName); return l }},
		{projections.EventsStream + "'s leader", func() int { l, _ := c.streamLeader(bg, js, projections.EventsStream); return l }},
	}
	for _, l := range leaders {
		if !sleepCtx(ctx, between(nf.rng, s.durScale(2*time.Second, 3*time.Second), s.durScale(3*time.Second, 6*time.Second))) {
			return false
		}
		elected, whole, err := c.killLeader(bg, sys, js, l.leader)
		if err != nil {
			res.note("SIGKILL of %s: %v", l.what, err)
			return false
		}
		nf.changes++
		resMu.Lock()
		res.ev.Other++
		res.noteRecover(whole)
		resMu.Unlock()
		res.note("%s SIGKILLed: another node led after %s, the cluster whole again after %s", l.what, elected.Round(time.Millisecond), whole.Round(time.Millisecond))
	}
	return true
}

// cutNode cuts a node off by its proxies for a few seconds: it must lose every
// route, and the cluster be whole again after.
func (nf *natsFaults) cutNode(bg context.Context, c *natsCluster, js jetstream.JetStream, res *result) {
	s := nf.s
	k := nf.rng.IntN(len(c.nodes))
	nd := c.nodes[k]
	began := time.Now()
	c.setCut(k, true)
	alone := pollUntil(bg, 10*time.Second, func() bool { n, err := nd.routeCount(bg); return err == nil && n == 0 }) == nil
	isolated := time.Since(began)
	sleepCtx(bg, s.durScale(3*time.Second, 6*time.Second))
	c.setCut(k, false)
	if err := c.waitWhole(bg, js); err != nil {
		res.note("after node %s was cut off: %v", nd.name, err)
		return
	}
	if !alone {
		res.note("node %s kept a route to the others through the cut", nd.name)
		return
	}
	nf.changes++
	resMu.Lock()
	res.ev.Other++
	resMu.Unlock()
	res.note("node %s cut off by its proxies (no route left after %s) for %s; whole again %s after the cut", nd.name, isolated.Round(time.Millisecond), s.durScale(3*time.Second, 6*time.Second), time.Since(began).Round(time.Millisecond))
}
