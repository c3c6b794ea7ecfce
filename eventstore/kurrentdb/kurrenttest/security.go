package kurrenttest

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"strings"

	"github.com/EventStore/EventStore-Client-Go/v4/protos/shared"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// User is an account of a secured server (WithUsers).
type User struct {
	Name, Password string
	Admin          bool // a member of $admins
	// ReadOnly: the ACLs grant it $r on the streams and on $all ($$$all's
	// $acl) but not $w (a $userStreamAcl whose $w leaves it out): its
	// appends, deletes and tombstones are refused with PermissionDenied.
	ReadOnly bool
}

// WithTLS makes the server speak TLS only, with cert (made for 127.0.0.1), as a
// secure node does.
func WithTLS(cert tls.Certificate) Option { return func(c *config) { c.tls = &cert } }

// WithUsers secures the stream operations as a secure node does with its
// default ACLs: a call without credentials is refused (PermissionDenied "Access
// Denied": anonymous stream access is off), and $all ($systemStreamAcl) may be
// read and subscribed to by $admins only; other streams by every user.
// ServerFeatures and Gossip stay open to callers without credentials, as the
// client calls them without. A call with a wrong user or password is
// Unauthenticated whatever its method, even one the server does not implement:
// a node authenticates before it routes. The client sends credentials over TLS
// only: use it with WithTLS.
func WithUsers(users ...User) Option {
	return func(c *config) {
		c.users = make(map[string]User, len(users))
		for _, u := range users {
			c.users[u.Name] = u
		}
	}
}

type userKey struct{}

// anonymous is the caller without credentials.
var anonymous = &User{}

// authenticate reads the basic-auth credentials of a call to a secured server,
// whatever its method (unknown ones too: see unknownService). A call without
// them passes as the anonymous user, whom only authorize refuses.
func (s *Server) authenticate(ctx context.Context) (context.Context, error) {
	if s.cfg.users == nil {
		return ctx, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	auth := md.Get("authorization")
	if len(auth) == 0 {
		return context.WithValue(ctx, userKey{}, anonymous), nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth[0], "Basic "))
	name, password, ok := strings.Cut(string(raw), ":")
	u, known := s.cfg.users[name]
	if err != nil || !ok || !known || u.Password != password {
		return nil, status.Error(codes.Unauthenticated, "Bad credentials")
	}
	return context.WithValue(ctx, userKey{}, &u), nil
}

// unknownService answers a call of a service the server does not implement
// (persistent subscriptions, projections, users, operations, ...) as gRPC
// does, Unimplemented; it runs behind the stream interceptor, so wrong
// credentials are refused first, as by a node.
func unknownService(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	return status.Errorf(codes.Unimplemented, "%s is not implemented by the test server", method)
}

// authorize applies the default ACLs to a stream operation: anonymous callers
// may do nothing, $all is for $admins.
func (s *Server) authorize(ctx context.Context, all bool) error {
	return s.authorizeOp(ctx, all, false)
}

// authorizeWrite applies them to a write: a ReadOnly user may not.
func (s *Server) authorizeWrite(ctx context.Context) error {
	return s.authorizeOp(ctx, false, true)
}

func (s *Server) authorizeOp(ctx context.Context, all, write bool) error {
	if s.cfg.users == nil {
		return nil
	}
	u, _ := ctx.Value(userKey{}).(*User)
	if u == nil || u == anonymous || (all && !u.Admin && !u.ReadOnly) || (write && u.ReadOnly) {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("exception", "access-denied"))
		return status.Error(codes.PermissionDenied, "Access Denied")
	}
	return nil
}

// readRequest reads what is left of a client-streaming call's request (to the
// client's half-close, or the call's end) before the server refuses it. A node
// refuses an append for its credentials as soon as it has authenticated them
// (wrong ones) or authorized its stream (none), usually after the client has
// sent a small request; answered earlier, the client's Send reports only
// io.EOF, which client v4.2.0 returns instead of the status. The test server,
// quicker than a node's authentication, answers after the request so that the
// client reads the status, as it usually does against a node.
//
// WithEarlyRefusals makes it refuse as early as a node can, without reading.
func (s *Server) readRequest(ss grpc.ServerStream) {
	if s.cfg.earlyRefusals {
		return
	}
	for ss.RecvMsg(new(shared.Empty)) == nil {
	}
}

// WithEarlyRefusals makes the server refuse an append on its header, without
// reading the rest of the request, as a node does (Streams.Append checks the
// ACL before it reads the events; its authentication runs before routing):
// the client, still sending a request larger than flow control lets through
// unread (an HTTP/2 window, 64 KiB at first), then loses the status and sees
// only io.EOF from client v4.2.0. Without it the server reads the request
// before it refuses, so that the client reads the status.
func WithEarlyRefusals() Option { return func(c *config) { c.earlyRefusals = true } }

// authedStream carries the authenticated context into a streaming handler.
type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (a authedStream) Context() context.Context { return a.ctx }
