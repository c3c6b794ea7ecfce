// Package freeport picks a free loopback TCP port for a server started later (a
// PostgreSQL cluster, a nats-server, a child process): the one home of the
// pick, which the kernel makes. The port was free when picked; another process
// may take it before it is bound, so a server that can bind "127.0.0.1:0"
// itself should do that instead.
package freeport

import (
	"fmt"
	"net"
)

// Loopback returns a TCP port of 127.0.0.1 that was free when asked.
func Loopback() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("picking a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
