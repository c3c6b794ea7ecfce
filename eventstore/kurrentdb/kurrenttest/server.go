package kurrenttest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/EventStore/EventStore-Client-Go/v4/protos/gossip"
	"github.com/EventStore/EventStore-Client-Go/v4/protos/serverfeatures"
	"github.com/EventStore/EventStore-Client-Go/v4/protos/shared"
	api "github.com/EventStore/EventStore-Client-Go/v4/protos/streams"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ServerVersion is what the server reports through ServerFeatures.
const ServerVersion = "24.10.0"

// Full gRPC method names, for FailNext.
const (
	MethodAppend              = api.Streams_Append_FullMethodName
	MethodRead                = api.Streams_Read_FullMethodName
	MethodTombstone           = api.Streams_Tombstone_FullMethodName
	MethodDelete              = api.Streams_Delete_FullMethodName
	MethodGetSupportedMethods = serverfeatures.ServerFeatures_GetSupportedMethods_FullMethodName
	MethodGossipRead          = gossip.Gossip_Read_FullMethodName
)

// DefaultIDCacheSize bounds the recently-written event IDs that Any and
// StreamExists appends consult for idempotency.
const DefaultIDCacheSize = 1 << 16

// Option configures a Server.
type Option func(*config)

type config struct {
	idCacheSize   int
	now           func() time.Time
	release       Release
	commitTimeout time.Duration
	maxAppendSize int
	emptyLog      bool
	earlyRefusals bool
	// maxAppendEventSize: 0 for none (24.10's int.MaxValue).
	maxAppendEventSize int
	tls                *tls.Certificate
	users              map[string]User // nil: no authentication
}

// Release names the KurrentDB release whose behaviour the server reproduces
// where releases differ. DefaultRelease is the newest one modelled.
type Release string

const (
	// Release24_10_4 has KDB-710: a filtered $all subscription from Start whose
	// catch-up reaches the end of the log on a page without a match sends a
	// checkpoint at the maximum position (2^64-1/2^64-1) before caught_up
	// (Enumerator.AllSubscriptionFiltered: ConvertCheckpoint(null) is
	// TFPos(-1,-1), converted unsigned). So do 24.2, 24.6 and 24.10.0-24.10.4.
	Release24_10_4 Release = "24.10.4"
	// Release23_10 starts a $all subscription after the first event at or after
	// its start position (ReadAllEventsForward(start, 1).NextPos): exclusive when
	// an event sits there, and losing the next event when none does. 24.2 and
	// later send every event strictly after the position and skip nothing. It
	// has no KDB-710.
	Release23_10 Release = "23.10"
	// Release24_10_5 fixed KDB-710 (as did 25.0).
	Release24_10_5 Release = "24.10.5"
	// DefaultRelease is what New models unless WithRelease says otherwise.
	DefaultRelease = Release24_10_5
)

// maxCheckpoint reports whether the release sends KDB-710's checkpoint.
func (r Release) maxCheckpoint() bool { return r == Release24_10_4 }

// liveCheckpoint reports whether a filtered $all subscription sends a
// checkpoint when its catch-up reaches the end, before caught_up (CatchUp on
// IsEndOfStream, 24.x). Not modelled for 23.10.
func (r Release) liveCheckpoint() bool { return r != Release23_10 }

// skipsAfterStart reports whether a $all subscription skips the first event at
// or after its start position (23.10) rather than starting strictly after it.
func (r Release) skipsAfterStart() bool { return r == Release23_10 }

// DefaultMaxAppendSize is the server's MaxAppendSize on the releases modelled
// (23.10, 24.10): 1,048,576 bytes, counted as Event.SizeOnDisk (data, metadata
// and twice the type's length). Later releases allow more: see WithMaxAppendSize.
const DefaultMaxAppendSize = 1 << 20

// WithMaxAppendEventSize sets the largest event an append may carry, in bytes
// counted as Event.SizeOnDisk (MaxAppendEventSize: unlimited on 24.10, the
// largest log record, 16 MiB, from 25.1); a larger one is refused with
// InvalidArgument "... exceeds Maximum Append Event Size of N." and the
// exception maximum-append-event-size-exceeded, while the server reads it.
func WithMaxAppendEventSize(bytes int) Option {
	return func(c *config) { c.maxAppendEventSize = bytes }
}

// WithMaxAppendSize sets the largest append the server takes, in bytes counted
// as Event.SizeOnDisk; a larger one is refused with InvalidArgument and the
// exception maximum-append-size-exceeded.
func WithMaxAppendSize(bytes int) Option { return func(c *config) { c.maxAppendSize = bytes } }

// WithRelease makes the server behave as the named release where the releases
// modelled differ (see Release).
func WithRelease(r Release) Option { return func(c *config) { c.release = r } }

// WithIDCacheSize bounds the recent-ID cache consulted by Any/StreamExists
// appends (the server's 8 MiB committed-events cache). Zero disables it.
func WithIDCacheSize(n int) Option { return func(c *config) { c.idCacheSize = n } }

// WithClock sets the clock that stamps the "created" metadata.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// Server is an in-process KurrentDB speaking the gRPC protocol of
// EventStore-Client-Go/v4: Streams (Append, Read, Delete, Tombstone), ServerFeatures
// and Gossip, on 127.0.0.1 only.
type Server struct {
	cfg     config
	release Release
	db      *db
	grpc    *grpc.Server
	lis     net.Listener
	done    chan struct{}
	id      uuid.UUID
	serve   error

	mu          sync.Mutex
	unavailable bool
	failNext    map[string][]codes.Code
	stalls      []bool // one per stalled append to come; true: commit before stalling
	afterWrite  []codes.Code
	notLeader   []string // leader endpoints (host:port) of the NotLeader answers to come
	subs        map[*subscription]struct{}
	subsChanged chan struct{}
	requests    map[string]int
	starts      []string
	leaderCalls int // calls that carried requires-leader: true
	readLag     int // see SetReadLag
}

// New starts a server on 127.0.0.1 with an ephemeral port.
func New(options ...Option) (*Server, error) {
	cfg := config{idCacheSize: DefaultIDCacheSize, now: time.Now, release: DefaultRelease, commitTimeout: DefaultCommitTimeout, maxAppendSize: DefaultMaxAppendSize}
	for _, o := range options {
		o(&cfg)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("kurrenttest: listen: %w", err)
	}
	s := &Server{
		cfg:         cfg,
		release:     cfg.release,
		db:          newDB(cfg.idCacheSize),
		lis:         lis,
		done:        make(chan struct{}),
		id:          uuid.New(),
		failNext:    make(map[string][]codes.Code),
		subs:        make(map[*subscription]struct{}),
		subsChanged: make(chan struct{}),
		requests:    make(map[string]int),
	}
	s.db.now = cfg.now
	if !cfg.emptyLog {
		s.db.seed()
	}
	opts := []grpc.ServerOption{
		grpc.UnaryInterceptor(s.unaryFaults),
		grpc.StreamInterceptor(s.streamFaults),
		grpc.UnknownServiceHandler(unknownService),
		// The client pings every 10 s, also without calls in flight.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	}
	if cfg.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{*cfg.tls}, MinVersion: tls.VersionTLS12})))
	}
	s.grpc = grpc.NewServer(opts...)
	api.RegisterStreamsServer(s.grpc, &streamsServer{s: s})
	serverfeatures.RegisterServerFeaturesServer(s.grpc, &featuresServer{})
	gossip.RegisterGossipServer(s.grpc, &gossipServer{s: s})
	go func() {
		defer close(s.done)
		s.serve = s.grpc.Serve(lis)
	}()
	return s, nil
}

// Start starts a server for the test and stops it at the test's end. It returns
// the server and its connection URL (kurrentdb://127.0.0.1:PORT?tls=false).
func Start(t testing.TB, opts ...Option) (*Server, string) {
	t.Helper()
	s, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s, s.URL()
}

// Addr is the host:port the server listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// URL is the ledger's connection URL for this server: with ?tls=false unless
// it speaks TLS (WithTLS), when the caller adds credentials and tlsCAFile.
func (s *Server) URL() string { return "kurrentdb://" + s.Addr() + s.tlsQuery() }

// ConnectionString is the EventStore-Client-Go connection string for this server.
func (s *Server) ConnectionString() string { return "esdb://" + s.Addr() + s.tlsQuery() }

func (s *Server) tlsQuery() string {
	if s.cfg.tls != nil {
		return ""
	}
	return "?tls=false"
}

// Stop closes every connection and the listener.
func (s *Server) Stop() {
	s.grpc.Stop()
	<-s.done
}

// SetUnavailable makes every new call, including the client's connect-time
// ServerFeatures call, fail with codes.Unavailable ("Server Is Not Ready") while on.
// Open subscriptions are not touched: see DropSubscriptions.
func (s *Server) SetUnavailable(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unavailable = on
}

// FailNext makes the next n calls of method (a full gRPC method name, see
// MethodAppend and friends) fail with code before doing anything. An append so
// failed ends before the server reads it: client v4.2.0 gets the status, or,
// when the answer beats its Send (in some runs on a loaded machine, in every
// run for an append larger than flow control lets through unread), a bare
// io.EOF. A test that needs the status uses FailNextAppendTo.
func (s *Server) FailNext(method string, n int, code codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.failNext[method] = append(s.failNext[method], code)
	}
}

// FailNextAppendTo makes the next append to stream fail with code once the
// request is read, before it writes anything: a fault aimed at one command's
// write, which other writers (a consumer deciding again, the transfer
// process's checkpoints) cannot take in its place, as they can FailNext's.
func (s *Server) FailNextAppendTo(stream string, code codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext[appendTo(stream)] = append(s.failNext[appendTo(stream)], code)
}

// appendTo is FailNextAppendTo's key in failNext, beside the methods'.
func appendTo(stream string) string { return MethodAppend + " to " + stream }

// failAppendTo is the fault FailNextAppendTo set for an append to stream.
func (s *Server) failAppendTo(stream string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.failNext[appendTo(stream)]
	if len(q) == 0 {
		return nil
	}
	s.failNext[appendTo(stream)] = q[1:]
	return status.Error(q[0], "fault injected by the test server")
}

// StallAppends makes the next n appends go unanswered until the caller's deadline
// or cancellation. With commit the events are written first: the reply is lost
// (an indefinite outcome); without, the request is lost.
func (s *Server) StallAppends(n int, commit bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.stalls = append(s.stalls, commit)
	}
}

// DropSubscriptions ends every open subscription with codes.Unavailable, as a
// node restart or a cut connection would, and reports how many it ended.
func (s *Server) DropSubscriptions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for sub := range s.subs {
		select {
		case sub.drop <- status.Error(codes.Unavailable, "subscription dropped by the test server"):
			n++
		default: // already being dropped
		}
	}
	return n
}

// Subscriptions reports how many subscriptions are open.
func (s *Server) Subscriptions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subs)
}

// SubscriptionStarts lists where every $all subscription so far started:
// "start", "end" or the exclusive "commit/prepare" position.
func (s *Server) SubscriptionStarts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.starts...)
}

func (s *Server) noteStart(from string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts = append(s.starts, from)
}

// Requests reports how many calls of method (a full gRPC method name) the
// server has received, failed ones included.
func (s *Server) Requests(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[method]
}

// Head is the log position of the last record, 0 when the log is empty.
func (s *Server) Head() uint64 {
	all, _ := s.db.snapshot(0)
	if len(all) == 0 {
		return 0
	}
	return all[len(all)-1].pos
}

// SetReadLag makes the server serve reads as a follower n records behind the
// leader would (0: off): stream reads, $all reads, subscriptions and so the
// head see the log without its last n committed records, and a subscription
// sees a record once n more are committed. Appends are decided on the whole log,
// as a follower forwards them to the leader. A call that carries
// requires-leader: true is served as the leader serves it (a real follower
// answers it NotLeader and the client reconnects to the leader: see
// NotLeaderNext for that answer). This is what a connection left on an old
// leader after an election sees, since client v4.2.0 never sends the header.
func (s *Server) SetReadLag(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readLag = n
}

// lagOf is how many records a read of this call lags (SetReadLag).
func (s *Server) lagOf(ctx context.Context) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if requiresLeader(ctx) {
		return 0
	}
	return s.readLag
}

func requiresLeader(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get("requires-leader")
	return len(v) > 0 && v[0] == "true"
}

// RequiresLeaderCalls counts the calls that carried the requires-leader: true
// header, which a follower answers NotLeader rather than forwarding the write.
func (s *Server) RequiresLeaderCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leaderCalls
}

func (s *Server) fault(ctx context.Context, method string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[method]++
	if requiresLeader(ctx) {
		s.leaderCalls++
	}
	if q := s.failNext[method]; len(q) > 0 {
		s.failNext[method] = q[1:]
		return status.Error(q[0], "fault injected by the test server")
	}
	if s.unavailable {
		return status.Error(codes.Unavailable, "Server Is Not Ready")
	}
	return nil
}

func (s *Server) nextStall() (stall, commit bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.stalls) == 0 {
		return false, false
	}
	commit = s.stalls[0]
	s.stalls = s.stalls[1:]
	return true, commit
}

func (s *Server) unaryFaults(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := s.fault(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	ctx, err := s.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (s *Server) streamFaults(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := s.fault(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	ctx, err := s.authenticate(ss.Context())
	if err != nil {
		if info.IsClientStream && !info.IsServerStream { // Append
			s.readRequest(ss)
		}
		return err
	}
	return handler(srv, authedStream{ServerStream: ss, ctx: ctx})
}

type subscription struct {
	drop chan error
}

func (s *Server) register() *subscription {
	sub := &subscription{drop: make(chan error, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs[sub] = struct{}{}
	return sub
}

func (s *Server) unregister(sub *subscription) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.subs, sub)
}

type featuresServer struct {
	serverfeatures.UnimplementedServerFeaturesServer
}

// GetSupportedMethods answers the client's connect-time probe. BatchAppend and
// persistent subscriptions are not offered, so the client never uses them.
func (featuresServer) GetSupportedMethods(context.Context, *shared.Empty) (*serverfeatures.SupportedMethods, error) {
	const svc = "event_store.client.streams.streams"
	return &serverfeatures.SupportedMethods{
		EventStoreServerVersion: ServerVersion,
		Methods: []*serverfeatures.SupportedMethod{
			{ServiceName: svc, MethodName: "read"},
			{ServiceName: svc, MethodName: "append"},
			{ServiceName: svc, MethodName: "tombstone"},
			{ServiceName: svc, MethodName: "delete"},
			{ServiceName: "event_store.client.gossip.gossip", MethodName: "read"},
			{ServiceName: "event_store.client.server_features.serverfeatures", MethodName: "getsupportedmethods"},
		},
	}, nil
}

type gossipServer struct {
	gossip.UnimplementedGossipServer
	s *Server
}

// Read describes a one-node cluster whose leader is this server, for clients
// that connect with gossip seeds or esdb+discover.
func (g *gossipServer) Read(context.Context, *shared.Empty) (*gossip.ClusterInfo, error) {
	host, portStr, _ := net.SplitHostPort(g.s.Addr())
	port, _ := strconv.Atoi(portStr)
	return &gossip.ClusterInfo{Members: []*gossip.MemberInfo{{
		InstanceId:   uuidToProto(g.s.id, false),
		TimeStamp:    ticks(time.Now()),
		State:        gossip.MemberInfo_Leader,
		IsAlive:      true,
		HttpEndPoint: &gossip.EndPoint{Address: host, Port: uint32(port)},
	}}}, nil
}
