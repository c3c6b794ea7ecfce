package kurrenttest

import (
	"context"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// DefaultCommitTimeout is how long an append waits for its write to be
// replicated before the server answers it Aborted ("Operation timed out"): the
// server's CommitTimeoutMs, 2,000 ms by default.
const DefaultCommitTimeout = 2 * time.Second

// WithCommitTimeout sets how long an append waits for replication (see
// HoldReplication) before it is answered Aborted.
func WithCommitTimeout(d time.Duration) Option { return func(c *config) { c.commitTimeout = d } }

// FailAppendsAfterWrite makes the next n appends that write events (an
// idempotent repeat does not count) write them, durable and visible, and then
// answer code instead of the result: a write whose
// acknowledgement was lost, as when the leader answers a commit timeout
// (codes.Aborted, "Operation timed out") for a write that still commits.
func (s *Server) FailAppendsAfterWrite(n int, code codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.afterWrite = append(s.afterWrite, code)
	}
}

// NotLeaderNext makes the next n appends write nothing and answer as a follower
// answers a write that requires the leader: NotFound "Leader info available"
// with the exception not-leader and the leader's endpoint in the trailers. The
// client reconnects to that endpoint. leader is host:port; "" names this server.
func (s *Server) NotLeaderNext(n int, leader string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if leader == "" {
		leader = s.Addr()
	}
	for range n {
		s.notLeader = append(s.notLeader, leader)
	}
}

// HoldReplication stops (on) or resumes (off) replication to the followers of a
// three-node cluster. While held, an append is written but not committed: no
// reader sees it, and it is answered Aborted after the commit timeout. A retry
// of it with the same event IDs matches the uncommitted write
// (IdempotentNotReady): nothing is written and it also times out. Resuming
// commits every held write, whose retries then get the original result.
func (s *Server) HoldReplication(on bool) { s.db.hold(on) }

func (s *Server) nextAfterWrite() (codes.Code, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.afterWrite) == 0 {
		return codes.OK, false
	}
	c := s.afterWrite[0]
	s.afterWrite = s.afterWrite[1:]
	return c, true
}

// notLeaderAnswer is RpcExceptions.LeaderInfo for the next NotLeaderNext
// answer, or nil.
func (s *Server) notLeaderAnswer(setTrailer func(metadata.MD)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.notLeader) == 0 {
		return nil
	}
	host, port, _ := net.SplitHostPort(s.notLeader[0])
	s.notLeader = s.notLeader[1:]
	setTrailer(metadata.Pairs("exception", "not-leader", "leader-endpoint-host", host, "leader-endpoint-port", port))
	return status.Error(codes.NotFound, "Leader info available")
}

// commitTimedOut is what a write not committed within the commit timeout gets.
func commitTimedOut() error {
	return status.Error(codes.Aborted, "Operation timed out: Commit timed out.")
}

// awaitCommit waits until the record at pos is committed; it fails with the
// commit timeout, or when the caller goes away.
func (s *Server) awaitCommit(ctx context.Context, pos uint64) error {
	timeout := time.NewTimer(s.cfg.commitTimeout)
	defer timeout.Stop()
	for {
		ok, changed := s.db.committed(pos)
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-timeout.C:
			return commitTimedOut()
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// awaitTimeout is an IdempotentNotReady request: the server does nothing and
// the request times out.
func (s *Server) awaitTimeout(ctx context.Context) error {
	select {
	case <-time.After(s.cfg.commitTimeout):
		return commitTimedOut()
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}
