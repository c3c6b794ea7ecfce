package embednats

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/ledgerworks/ledger/internal/platform/freeport"
)

// clusterReadyTimeout bounds the wait for a new cluster's meta leader.
const clusterReadyTimeout = 60 * time.Second

func clusterOptions(opts *server.Options, o Options) error {
	host, portStr, err := net.SplitHostPort(o.ClusterAddr)
	if err != nil {
		return fmt.Errorf("embednats: cluster address %q: %w", o.ClusterAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("embednats: cluster address %q: %w", o.ClusterAddr, err)
	}
	opts.Cluster = server.ClusterOpts{Name: o.ClusterName, Host: host, Port: port, Advertise: o.ClusterAdvertise, NoAdvertise: o.NoAdvertise}
	for _, r := range o.Routes {
		u, err := url.Parse(r)
		if err != nil {
			return fmt.Errorf("embednats: route %q: %w", r, err)
		}
		opts.Routes = append(opts.Routes, u)
	}
	return nil
}

// ClusterNode is where one node of a cluster listens and keeps its files: the
// same again is the same node restarted.
type ClusterNode struct {
	Name        string
	ClientAddr  string // host:port of clients
	ClusterAddr string // host:port of the routes
	StoreDir    string
}

// Cluster is a JetStream cluster on loopback, each node a server of this
// process: the production shape's NATS (docs/operations.md) for tests and the
// chaos suite.
type Cluster struct {
	Name  string
	Nodes []ClusterNode
	base  Options
}

// NewCluster lays out n nodes on free loopback ports with their files under
// dir/<node name>; Start starts them.
func NewCluster(name string, n int, dir string, base Options) (*Cluster, error) {
	c := &Cluster{Name: name, base: base}
	for i := range n {
		client, err := freeAddr()
		if err != nil {
			return nil, err
		}
		route, err := freeAddr()
		if err != nil {
			return nil, err
		}
		nm := fmt.Sprintf("%s-%d", name, i+1)
		c.Nodes = append(c.Nodes, ClusterNode{Name: nm, ClientAddr: client, ClusterAddr: route, StoreDir: filepath.Join(dir, nm)})
	}
	return c, nil
}

func freeAddr() (string, error) {
	port, err := freeport.Loopback()
	if err != nil {
		return "", fmt.Errorf("embednats: %w", err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

// StartNode starts node i (again, after it was shut down).
func (c *Cluster) StartNode(i int) (*server.Server, error) {
	n := c.Nodes[i]
	o := c.base
	o.Name, o.Addr, o.StoreDir, o.ClusterName, o.ClusterAddr = n.Name, n.ClientAddr, n.StoreDir, c.Name, n.ClusterAddr
	o.Routes = nil
	for j, m := range c.Nodes {
		if j != i {
			o.Routes = append(o.Routes, "nats-route://"+m.ClusterAddr)
		}
	}
	return Start(o)
}

// Start starts every node and waits until the cluster has a JetStream meta
// leader that every node follows. On error the nodes started are shut down.
func (c *Cluster) Start() ([]*server.Server, error) {
	var servers []*server.Server
	stop := func() {
		for _, s := range servers {
			s.Shutdown()
		}
	}
	for i := range c.Nodes {
		s, err := c.StartNode(i)
		if err != nil {
			stop()
			return nil, err
		}
		servers = append(servers, s)
	}
	if err := WaitClusterReady(servers, clusterReadyTimeout); err != nil {
		stop()
		return nil, err
	}
	return servers, nil
}

// WaitClusterReady waits until one of servers is the JetStream meta leader
// and every one of them is current with it.
func WaitClusterReady(servers []*server.Server, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		leader, current := false, true
		for _, s := range servers {
			leader = leader || s.JetStreamIsLeader()
			current = current && s.JetStreamIsCurrent()
		}
		if leader && current {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("embednats: the cluster has no JetStream meta leader that every node follows")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// URL is the NATS URL of every node, comma-separated, as clients take it.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = "nats://" + n.ClientAddr
	}
	return strings.Join(urls, ",")
}
