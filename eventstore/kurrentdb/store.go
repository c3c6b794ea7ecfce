package kurrentdb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ledgerworks/ledger/eventstore"
)

// ErrStreamDeleted marks an operation on a tombstoned stream. Reads of such a
// stream match eventstore.ErrStreamNotFound too only for a system ($) stream:
// the events of any other stay in $all, and it must not be taken for new.
var ErrStreamDeleted = errors.New("kurrentdb: stream deleted")

// ErrAppendTooLarge marks an append over the server's maximum append size
// (MaxAppendSize, 1 MiB by default on 24.10) or with an event over its
// maximum event size (MaxAppendEventSize, from 25.1). Retrying cannot help.
var ErrAppendTooLarge = errors.New("kurrentdb: append over the maximum append size")

// ErrInvalidPosition marks a $all read or subscription from a position the log
// has no record at (inside a record): the server refuses it. Retrying cannot help.
var ErrInvalidPosition = errors.New("kurrentdb: invalid $all position")

// ErrUnauthenticated marks a server that refused the credentials of the URL
// (a wrong user or password). Retrying cannot help.
var ErrUnauthenticated = errors.New("kurrentdb: authentication failed (check the user and password of the URL)")

// ErrAccessDenied marks an operation the user may not do: without credentials
// on a secure node, or reading $all without being in $admins (or an ACL
// granting $all read). Retrying cannot help.
var ErrAccessDenied = errors.New("kurrentdb: access denied")

// ErrStreamTruncated marks a stream whose history reads cannot show in full:
// a forward read whose first event is not at the revision asked for (or, from
// revision 0, that finds nothing), because the stream's metadata ($tb,
// $maxCount, $maxAge, a soft delete) or a scavenge removed the events before;
// a read of a soft-deleted stream, which the server answers not found;
// or an append the server answered in a way reads cannot back: as a repeat of
// events they cannot show, or written past revision 0 when it expected no
// stream (a soft-deleted stream, which that append un-deleted). It is never
// retried.
var ErrStreamTruncated = errors.New("kurrentdb: stream truncated")

// errClosed is returned by every call after Close.
var errClosed = errors.New("kurrentdb: store closed")

// Defaults, each overridable with an Option.
const (
	DefaultBackoffMin          = 50 * time.Millisecond
	DefaultBackoffMax          = 5 * time.Second
	DefaultResubscribeAttempts = 20 // consecutive failed resubscriptions before a subscription ends
	DefaultSearchWindow        = 32 // events the server scans per filtered page
	DefaultCheckpointMultiple  = 1  // a checkpoint every DefaultSearchWindow considered events
	// DefaultMaxAppendSize is KurrentDB 24.10's MaxAppendSize: 1,048,576 bytes,
	// counted as the server does (data, metadata and twice the type's length).
	DefaultMaxAppendSize = 1 << 20
	// probeRevision is the expected revision of the append of no events that
	// asks whether the server accepts an append's header: no stream reaches
	// it, so the server answers a wrong expected version and writes nothing.
	probeRevision     = 1 << 62
	defaultBufferSize = 512
	closeDrainTimeout = 5 * time.Second
	headPageSize      = 32
)

// Option configures a Store.
type Option func(*options)

type options struct {
	logger              *slog.Logger
	backoffMin          time.Duration
	backoffMax          time.Duration
	resubscribeAttempts int
	searchWindow        int
	checkpointMultiple  int
	maxAppendSize       int
	maxAppendEventSize  int // 0: none
	appendChecked       []string
}

// WithLogger sends the client library's log lines to l (debug and info at Debug,
// warnings and errors at Warn). Without it they are discarded.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithAppendCheckedStreams names, by prefix, the streams whose not-found read
// answers are taken on the server's word, without the read of their metadata
// that tells a soft-deleted stream (see notFound). Fit only for streams a
// caller reads to decide whether to append to them expecting no stream: a
// soft-deleted one's no_stream append is ErrStreamTruncated (see appended).
// The ledger names its key streams, read before nearly every command on a busy
// account and nearly always absent: the metadata read would double its reads.
func WithAppendCheckedStreams(prefixes ...string) Option {
	return func(o *options) { o.appendChecked = append(o.appendChecked, prefixes...) }
}

// WithResubscribe sets the back-off between resubscriptions after a dropped
// subscription (doubling from min up to max) and how many consecutive failed
// attempts end the subscription (its Err then wraps eventstore.ErrUnavailable).
func WithResubscribe(min, max time.Duration, attempts int) Option {
	return func(o *options) { o.backoffMin, o.backoffMax, o.resubscribeAttempts = min, max, attempts }
}

// WithCheckpointWindow sets the server-side filter's search window and the
// checkpoint interval multiplier: the server sends a checkpoint every
// window*multiple considered events.
func WithCheckpointWindow(window, multiple int) Option {
	return func(o *options) { o.searchWindow, o.checkpointMultiple = window, multiple }
}

// WithMaxAppendSize sets the largest append the store sends, in bytes counted as
// the server counts them; a larger one fails with ErrAppendTooLarge before it is
// sent. Set it to the server's MaxAppendSize (larger on 25.x than 24.10's 1 MiB)
// or below: the server refuses a larger append while the client is still
// sending it, and the client then reports only io.EOF, which the store tells
// from a lost connection only with two more calls (see resendAfterEarlyEnd).
func WithMaxAppendSize(bytes int) Option { return func(o *options) { o.maxAppendSize = bytes } }

// WithMaxAppendEventSize sets the largest event the store sends, in bytes
// counted as the server counts them; an append with a larger one fails with
// ErrAppendTooLarge before it is sent. Set it to the server's
// MaxAppendEventSize where that is below the append size (from 25.1 it is
// the largest log record, 16 MiB by default; 24.10 has none). Without it
// (the default) the store checks the append's size only.
func WithMaxAppendEventSize(bytes int) Option {
	return func(o *options) { o.maxAppendEventSize = bytes }
}

// ConnectionString turns a ledger URL (kurrentdb://, kurrentdb+discover://,
// kurrent://, esdb://, esdb+discover://) into EventStore-Client-Go's connection
// string, keeping hosts, credentials and query options such as tls=false.
func ConnectionString(url string) (string, error) {
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return "", fmt.Errorf("kurrentdb: %q is not a URL", url)
	}
	switch strings.ToLower(scheme) {
	case "kurrentdb", "kurrent", "esdb":
		return "esdb://" + rest, nil
	case "kurrentdb+discover", "kurrent+discover", "esdb+discover":
		return "esdb+discover://" + rest, nil
	}
	return "", fmt.Errorf("kurrentdb: unsupported scheme %q (want kurrentdb:// or esdb://)", scheme)
}

// DefaultMaxDiscoverAttempts bounds the client's rediscovery when the URL does not
// (maxDiscoverAttempts=N): 3,000 attempts 100 ms apart, about five minutes.
const DefaultMaxDiscoverAttempts = 3000

// Store is eventstore.Store over one KurrentDB node or cluster.
type Store struct {
	cfg  esdb.Configuration
	opts options

	mu       sync.Mutex
	client   *esdb.Client
	dead     map[*esdb.Client]bool // clients whose connection loop has ended
	closed   bool
	inflight int
	drained  chan struct{}

	subCtx    context.Context
	cancelSub context.CancelFunc
	subs      sync.WaitGroup

	lastErr atomic.Pointer[string] // the client's last warning or error, password removed
}

var _ eventstore.Store = (*Store)(nil)

// Open connects to the server named by url and checks that it answers.
func Open(ctx context.Context, url string, opts ...Option) (*Store, error) {
	cs, err := ConnectionString(url)
	if err != nil {
		return nil, err
	}
	cfg, err := esdb.ParseConnectionString(cs)
	if err != nil {
		return nil, fmt.Errorf("kurrentdb: %w", err)
	}
	o := options{
		backoffMin:          DefaultBackoffMin,
		backoffMax:          DefaultBackoffMax,
		resubscribeAttempts: DefaultResubscribeAttempts,
		searchWindow:        DefaultSearchWindow,
		checkpointMultiple:  DefaultCheckpointMultiple,
		maxAppendSize:       DefaultMaxAppendSize,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if !strings.Contains(strings.ToLower(cs), "maxdiscoverattempts=") {
		// The client gives up its connection for good after MaxDiscoverAttempts
		// failed discoveries (default 10, about a second), stranding calls inside
		// it. Keep rediscovering through an outage of minutes instead: calls still
		// return at their own deadline meanwhile.
		cfg.MaxDiscoverAttempts = DefaultMaxDiscoverAttempts
	}
	s := &Store{cfg: *cfg, opts: o, dead: make(map[*esdb.Client]bool)}
	s.cfg.Logger = s.keepLastError(clientLogger(o.logger))
	s.subCtx, s.cancelSub = context.WithCancel(context.Background())
	if s.client, err = s.newClient(); err != nil {
		return nil, err
	}
	if _, err := s.readAllPage(ctx, esdb.End{}, esdb.Backwards, 1); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("kurrentdb: connect to %s: %w%s", redact(url), err, s.lastClientError(err))
	}
	return s, nil
}

func redact(url string) string {
	if scheme, rest, ok := strings.Cut(url, "://"); ok {
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			return scheme + "://***@" + rest[at+1:]
		}
	}
	return url
}

// keepLastError wraps the client's logger to keep its last warning or error:
// while the client rediscovers the node (a TLS handshake refused, say) the
// call only sees the caller's deadline, and Open reports that line with it.
func (s *Store) keepLastError(log esdb.LoggingFunc) esdb.LoggingFunc {
	return func(level esdb.LogLevel, format string, args ...any) {
		if level == esdb.LogWarn || level == esdb.LogError {
			line := fmt.Sprintf(format, args...)
			if s.cfg.Password != "" {
				line = strings.ReplaceAll(line, s.cfg.Password, "***")
			}
			s.lastErr.Store(&line)
		}
		log(level, format, args...)
	}
}

// lastClientError is the client's last warning or error, for an Open that
// failed without an answer from the server.
func (s *Store) lastClientError(err error) string {
	line := s.lastErr.Load()
	if line == nil || !errors.Is(err, eventstore.ErrUnavailable) {
		return ""
	}
	return " (the client's last error: " + *line + ")"
}

func clientLogger(l *slog.Logger) esdb.LoggingFunc {
	if l == nil {
		return esdb.NoopLogging()
	}
	return func(level esdb.LogLevel, format string, args ...any) {
		lvl := slog.LevelDebug
		if (level == esdb.LogWarn || level == esdb.LogError) && !cancellation(args) {
			lvl = slog.LevelWarn
		}
		l.Log(context.Background(), lvl, "kurrentdb client: "+fmt.Sprintf(format, args...))
	}
}

// cancellation reports a log line about a call its caller cancelled: the client
// logs every closed subscription as an error.
func cancellation(args []any) bool {
	for _, a := range args {
		if err, ok := a.(error); ok && (errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled) {
			return true
		}
	}
	return false
}

func (s *Store) newClient() (*esdb.Client, error) {
	cfg := s.cfg
	c, err := esdb.NewClient(&cfg)
	if err != nil {
		return nil, fmt.Errorf("kurrentdb: %w", err)
	}
	return c, nil
}

// acquire returns the client to use and counts the call in flight.
func (s *Store) acquire() (*esdb.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	s.inflight++
	return s.client, nil
}

func (s *Store) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	if s.inflight == 0 && s.drained != nil {
		close(s.drained)
		s.drained = nil
	}
}

// noteError replaces a client whose connection loop has ended. The client's loop
// ends for good when node discovery fails MaxDiscoverAttempts times; every later
// call then fails with ErrorCodeConnectionClosed. Such a client is never closed:
// a call that failed with Unavailable after its loop ended is blocked sending a
// reconnect message to it, and closing the loop's channel would panic that call.
func (s *Store) noteError(c *esdb.Client, err error) {
	var e *esdb.Error
	if !errors.As(err, &e) {
		return
	}
	dead := e.Code() == esdb.ErrorCodeConnectionClosed ||
		strings.Contains(err.Error(), "maximum discovery attempt count reached")
	if !dead {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead[c] = true
	if s.closed || s.client != c {
		return
	}
	if nc, err := s.newClient(); err == nil {
		s.client = nc
	}
}

// do runs op with the current client and returns when op does or ctx ends. The
// client ignores ctx while it (re)discovers the node, so op runs on its own
// goroutine; it still gets ctx, so its gRPC call is abandoned with the caller.
//
// op's context carries requires-leader: true, which client v4.2.0 means to
// send (its default node preference is the leader) but puts into an incoming
// context, so it never does: a connection left on an old leader after an
// election would be served reads, $all and subscriptions from that follower's
// lagging log, and the ledger's retries on a stale read use up their attempts.
// With the header a follower answers NotLeader and the client reconnects to the
// leader; nothing was done, so op runs once more, there.
func (s *Store) do(ctx context.Context, op func(context.Context, *esdb.Client) error) error {
	if err := ctx.Err(); err != nil {
		return err // nothing is sent for a caller that has already gone
	}
	c, err := s.acquire()
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	lctx := metadata.AppendToOutgoingContext(ctx, "requires-leader", "true")
	go func() {
		defer s.release()
		err := op(lctx, c)
		if notLeader(err) {
			err = op(lctx, c)
		}
		if err != nil {
			s.noteError(c, err)
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done: // finished at the same moment: keep its outcome
			return err
		default:
		}
		return ctx.Err()
	}
}

// notLeader reports a follower's answer to a call that requires the leader.
func notLeader(err error) bool {
	var e *esdb.Error
	return errors.As(err, &e) && e.Code() == esdb.ErrorCodeNotLeader
}

// Close ends every subscription and closes the connection.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	drained := make(chan struct{})
	if s.inflight == 0 {
		close(drained)
	} else {
		s.drained = drained
	}
	c := s.client
	dead := s.dead[c]
	s.mu.Unlock()

	s.cancelSub()
	s.subs.Wait()
	select {
	case <-drained:
	case <-time.After(closeDrainTimeout):
		// A call is still inside the client: closing now could panic it (see noteError).
		return errors.New("kurrentdb: close: calls still in flight, connection left open")
	}
	if !dead {
		return c.Close()
	}
	return nil
}

// mapError turns a client or transport error into the contract's errors.
func mapError(ctx context.Context, err error, what string) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			return fmt.Errorf("kurrentdb: %s: %w: %w", what, eventstore.ErrUnavailable, ctxErr)
		}
		return fmt.Errorf("kurrentdb: %s: %w", what, ctxErr)
	}
	if errors.Is(err, errClosed) {
		return err
	}
	var e *esdb.Error
	if status.Code(err) == codes.DeadlineExceeded || (errors.As(err, &e) && e.Code() == esdb.ErrorCodeDeadlineExceeded) {
		// gRPC may report the caller's deadline before ctx.Err() turns non-nil.
		return fmt.Errorf("kurrentdb: %s: %w: %w: %w", what, eventstore.ErrUnavailable, context.DeadlineExceeded, err)
	}
	if errors.As(err, &e) {
		switch e.Code() {
		case esdb.ErrorCodeStreamDeleted:
			return fmt.Errorf("kurrentdb: %s: %w", what, ErrStreamDeleted)
		case esdb.ErrorUnavailable, esdb.ErrorCodeDeadlineExceeded, esdb.ErrorCodeConnectionClosed,
			esdb.ErrorCodeNotLeader, esdb.ErrorAborted:
			return fmt.Errorf("kurrentdb: %s: %w: %w", what, eventstore.ErrUnavailable, err)
		case esdb.ErrorCodeUnauthenticated:
			return fmt.Errorf("kurrentdb: %s: %w: %w", what, ErrUnauthenticated, err)
		case esdb.ErrorCodeAccessDenied:
			if strings.Contains(what, "$all") {
				return fmt.Errorf("kurrentdb: %s: %w (reading $all needs $admins, or an ACL granting $all read, to the user of the URL): %w", what, ErrAccessDenied, err)
			}
			return fmt.Errorf("kurrentdb: %s: %w: %w", what, ErrAccessDenied, err)
		}
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.InvalidArgument && tooLarge(st.Message()) {
		return fmt.Errorf("kurrentdb: %s: %w: %w", what, ErrAppendTooLarge, err)
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.InvalidArgument && strings.Contains(st.Message(), "invalid position") {
		return fmt.Errorf("kurrentdb: %s: %w: %w", what, ErrInvalidPosition, err)
	}
	if errors.Is(err, io.EOF) {
		// The server ended an append before the client had sent it all; the client
		// lost its status on the way (it reports Send's io.EOF). Nothing was committed:
		// the server commits only after the whole request, so a retry is safe.
		return fmt.Errorf("kurrentdb: %s: call ended early by the server: %w: %w", what, eventstore.ErrUnavailable, err)
	}
	if transient(err) {
		return fmt.Errorf("kurrentdb: %s: %w: %w", what, eventstore.ErrUnavailable, err)
	}
	return fmt.Errorf("kurrentdb: %s: %w", what, err)
}

// tooLarge reports the server's refusals of an append's size: of the whole
// ("Maximum Append Size of N Exceeded.") or of one event ("Event with Id: ...,
// Size: ..., exceeds Maximum Append Event Size of N.", 24.10 to 26.1).
func tooLarge(msg string) bool {
	return strings.Contains(msg, "Maximum Append Size") || strings.Contains(msg, "Maximum Append Event Size")
}

// transient reports whether a gRPC failure is worth retrying. The server answers
// its own timeouts with Aborted ("Operation timed out").
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

func toESDBExpected(e eventstore.ExpectedRevision) esdb.ExpectedRevision {
	switch {
	case e.IsNoStream():
		return esdb.NoStream{}
	case e.IsStreamExists():
		return esdb.StreamExists{}
	}
	if r, ok := e.Exact(); ok {
		return esdb.Revision(r)
	}
	return esdb.Any{}
}

// The client keeps the server's current revision only in the error's text:
// "wrong expected version: expecting '%s' but got '%s'".
var actualRevision = regexp.MustCompile(`but got '([^']*)'`)

func parseActual(err error) (int64, bool) {
	m := actualRevision.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, false
	}
	if m[1] == "no_stream" {
		return -1, true
	}
	n, perr := strconv.ParseInt(m[1], 10, 64)
	return n, perr == nil
}

// Append appends events with an expected revision. The server applies the
// IndexWriter rules; for an idempotent re-append it answers with the original
// write's last revision and position, which this maps to the original result.
func (s *Store) Append(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.AppendResult, error) {
	if len(events) == 0 {
		return eventstore.AppendResult{}, fmt.Errorf("kurrentdb: append to %q: no events", stream)
	}
	out, err := s.toESDBEvents(stream, events)
	if err != nil {
		return eventstore.AppendResult{}, err
	}
	wr, err := s.send(ctx, stream, expected, out.events)
	if errors.Is(err, io.EOF) {
		wr, err = s.resendAfterEarlyEnd(ctx, stream, expected, out)
	}
	if errors.Is(err, ErrAppendTooLarge) {
		return eventstore.AppendResult{}, err
	}
	if err != nil {
		var e *esdb.Error
		if errors.As(err, &e) && e.Code() == esdb.ErrorCodeWrongExpectedVersion {
			actual, ok := parseActual(e)
			if !ok {
				actual = s.lastRevision(ctx, stream)
			}
			return eventstore.AppendResult{}, &eventstore.WrongExpectedRevisionError{Stream: stream, Expected: expected, Actual: actual}
		}
		return eventstore.AppendResult{}, mapError(ctx, err, "append to "+stream)
	}
	return s.appended(ctx, stream, expected, events, wr)
}

// send sends one append. On an error it does not read wr: do returns at the
// caller's deadline while op may still be running.
func (s *Store) send(ctx context.Context, stream string, expected eventstore.ExpectedRevision, data []esdb.EventData) (*esdb.WriteResult, error) {
	var wr *esdb.WriteResult
	err := s.do(ctx, func(ctx context.Context, c *esdb.Client) error {
		var err error
		wr, err = c.AppendToStream(ctx, stream, esdb.AppendToStreamOptions{ExpectedRevision: toESDBExpected(expected)}, data...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return wr, nil
}

// resendAfterEarlyEnd follows an append that the server ended before the
// client had sent it all: client v4.2.0 then returns Send's io.EOF and loses
// the status. A node refuses so on the header (no right to write the stream,
// before it reads the events) and on the body (an event or the append over
// its size limits, as it reads them); a lost connection ends a call so too.
// Nothing was committed (the server commits only after the whole request).
// It asks about the header alone, with an append of no events at a revision
// no stream reaches (answered wrong expected version, nothing written): a
// refusal there (ErrAccessDenied, ErrUnauthenticated) is the answer. Else it
// resends the append once, and a second early end is ErrAppendTooLarge. So
// an early end costs at most two more calls, never an endless retry.
func (s *Store) resendAfterEarlyEnd(ctx context.Context, stream string, expected eventstore.ExpectedRevision, out outgoing) (*esdb.WriteResult, error) {
	_, err := s.send(ctx, stream, eventstore.Exact(probeRevision), nil)
	var e *esdb.Error
	if err != nil && !(errors.As(err, &e) && (e.Code() == esdb.ErrorCodeWrongExpectedVersion || e.Code() == esdb.ErrorCodeStreamDeleted)) {
		return nil, err
	}
	wr, err := s.send(ctx, stream, expected, out.events)
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("kurrentdb: append to %q: %w: the server ended it early twice while it accepts the stream's header, so its limits (MaxAppendSize, MaxAppendEventSize) are below this append's %d bytes: set WithMaxAppendSize and WithMaxAppendEventSize to them (%v)",
			stream, ErrAppendTooLarge, out.size, err)
	}
	return wr, err
}

// appended turns the server's answer to an append into its result. It refuses
// an answer that reads cannot back, with ErrStreamTruncated: events written
// past revision 0 of a stream expected not to exist (the server un-deleted a
// soft-deleted stream and wrote at N+1, hiding its history), and a repeat
// answered without a position whose events a read cannot show (the server's
// IndexWriter matches event IDs ignoring metadata; its ReadEvent honours it):
// either would let a caller take a stream's history for empty.
func (s *Store) appended(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData, wr *esdb.WriteResult) (eventstore.AppendResult, error) {
	last := wr.NextExpectedVersion
	n := uint64(len(events))
	if last+1 < n {
		// Only an Any re-append matched from the server's ID cache could answer so.
		return eventstore.AppendResult{}, fmt.Errorf("kurrentdb: append %d events to %q: the server answered revision %d", n, stream, last)
	}
	res := eventstore.AppendResult{
		FirstRevision: last + 1 - n,
		LastRevision:  last,
		Position:      eventstore.Position{Commit: wr.CommitPosition, Prepare: wr.PreparePosition},
	}
	if expected.IsNoStream() && res.FirstRevision != 0 {
		return eventstore.AppendResult{}, fmt.Errorf("kurrentdb: append to %q expecting no stream: %w: the server wrote at revision %d, so the stream had events that reads did not show (soft-deleted: this append un-deleted it)",
			stream, ErrStreamTruncated, res.FirstRevision)
	}
	if res.Position != eventstore.Start {
		return res, nil
	}
	// The server answered without a position (no_position): a repeat of events
	// its reads cannot show, or not yet indexed. Read the last one back.
	evs, err := s.ReadStream(ctx, stream, last, eventstore.Backwards, 1)
	switch {
	case err == nil && len(evs) == 1 && evs[0].Revision == last && evs[0].ID == events[n-1].ID:
		res.Position = evs[0].Position
		return res, nil
	case errors.Is(err, eventstore.ErrUnavailable) || errors.Is(err, context.Canceled):
		return eventstore.AppendResult{}, err
	}
	return eventstore.AppendResult{}, fmt.Errorf("kurrentdb: append to %q: %w: the server answered it as a repeat of events at revisions %d-%d that reads cannot show (the stream is soft-deleted or its metadata truncates them; read back: %d events, %v)",
		stream, ErrStreamTruncated, res.FirstRevision, last, len(evs), err)
}

// outgoing is an append's events as the client sends them, and their size as
// the server counts it.
type outgoing struct {
	events []esdb.EventData
	size   int
}

// toESDBEvents checks events as the server would before sending them: the
// server refuses an event without ID or type, and an append over its maximum
// size, while it reads the request, and the client then loses the status.
func (s *Store) toESDBEvents(stream string, events []eventstore.EventData) (outgoing, error) {
	data := make([]esdb.EventData, len(events))
	size := 0
	for i, e := range events {
		switch {
		case e.ID == uuid.Nil:
			// The client would make up a random ID, and with it a new intent.
			return outgoing{}, fmt.Errorf("kurrentdb: append to %q: event %d has no ID", stream, i)
		case e.Type == "":
			return outgoing{}, fmt.Errorf("kurrentdb: append to %q: event %d has no type", stream, i)
		}
		// At least the server's count (Event.SizeOnDisk: the type in UTF-16).
		one := len(e.Data) + len(e.Metadata) + 2*len(e.Type)
		if max := s.opts.maxAppendEventSize; max > 0 && one > max {
			return outgoing{}, fmt.Errorf("kurrentdb: append to %q: %w (event %d has %d bytes, limit %d per event)",
				stream, ErrAppendTooLarge, i, one, max)
		}
		size += one
		if size > s.opts.maxAppendSize {
			return outgoing{}, fmt.Errorf("kurrentdb: append to %q: %w (%d bytes from event %d, limit %d)",
				stream, ErrAppendTooLarge, size, i, s.opts.maxAppendSize)
		}
		data[i] = esdb.EventData{
			EventID:     e.ID,
			EventType:   e.Type,
			ContentType: esdb.ContentTypeJson,
			Data:        e.Data,
			Metadata:    e.Metadata,
		}
	}
	return outgoing{events: data, size: size}, nil
}

// lastRevision is the stream's last revision, -1 when it has none or when it
// cannot be read.
func (s *Store) lastRevision(ctx context.Context, stream string) int64 {
	evs, err := s.ReadStream(ctx, stream, eventstore.EndOfStream, eventstore.Backwards, 1)
	if err != nil || len(evs) == 0 {
		return -1
	}
	return int64(evs[0].Revision)
}

func toRecorded(r *esdb.RecordedEvent) eventstore.RecordedEvent {
	return eventstore.RecordedEvent{
		ID:       r.EventID,
		Stream:   r.StreamID,
		Revision: r.EventNumber,
		Position: eventstore.Position{Commit: r.Position.Commit, Prepare: r.Position.Prepare},
		Type:     r.EventType,
		Data:     r.Data,
		Metadata: r.UserMetadata,
		Created:  r.CreatedDate,
	}
}

// isSystem reports a KurrentDB system record: a $-prefixed stream ($$metadata,
// $stats, $users, ...) or event type ($streamDeleted, $metadata, ...).
func isSystem(stream, eventType string) bool {
	return strings.HasPrefix(stream, "$") || strings.HasPrefix(eventType, "$")
}

// ReadStream reads up to max events (max <= 0: all) of one stream.
func (s *Store) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	opts := esdb.ReadStreamOptions{Direction: esdb.Forwards, From: esdb.Revision(from)}
	if dir == eventstore.Backwards {
		opts.Direction = esdb.Backwards
		if from == eventstore.EndOfStream {
			opts.From = esdb.End{}
		}
	}
	count := uint64(math.MaxUint64)
	if max > 0 {
		count = uint64(max)
	}
	var out []eventstore.RecordedEvent
	err := s.do(ctx, func(ctx context.Context, c *esdb.Client) error {
		rs, err := c.ReadStream(ctx, stream, opts, count)
		if err != nil {
			return err
		}
		out, err = drainRecords(rs)
		return err
	})
	if err != nil {
		var e *esdb.Error
		if errors.As(err, &e) {
			switch e.Code() {
			case esdb.ErrorCodeResourceNotFound:
				return nil, s.notFound(ctx, stream)
			case esdb.ErrorCodeStreamDeleted:
				return nil, tombstoned(stream)
			}
		}
		return nil, mapError(ctx, err, fmt.Sprintf("read %q", stream))
	}
	if dir == eventstore.Forwards && len(out) > 0 && out[0].Revision > from {
		return nil, fmt.Errorf("kurrentdb: read %q from revision %d: %w: the first readable event is %d",
			stream, from, ErrStreamTruncated, out[0].Revision)
	}
	if dir == eventstore.Forwards && from == 0 && len(out) == 0 {
		// The server found the stream (else stream_not_found) but none of its events.
		return nil, fmt.Errorf("kurrentdb: read %q from revision 0: %w: the stream exists but none of its events can be read", stream, ErrStreamTruncated)
	}
	return out, nil
}

// notFound is the answer to a read the server answered stream_not_found: a
// stream never written, or a soft-deleted one (the server answers its reads
// so while its events stay in the log, in its idempotency check, and come back
// under a $tb when it is written again). Taking the latter for a new stream
// would let a caller decide on a history it cannot see: the ledger answered an
// applied deposit's resend account_not_found. So, for a stream outside $, the
// stream's metadata is read too (one read more, only on this answer; it needs
// the metadata-read right $mr): its $tb at the deleted marker is
// ErrStreamTruncated, never ErrStreamNotFound.
func (s *Store) notFound(ctx context.Context, stream string) error {
	nf := fmt.Errorf("kurrentdb: read %q: %w", stream, eventstore.ErrStreamNotFound)
	if strings.HasPrefix(stream, "$") || slices.ContainsFunc(s.opts.appendChecked, func(p string) bool { return strings.HasPrefix(stream, p) }) {
		return nf
	}
	evs, err := s.ReadStream(ctx, "$$"+stream, eventstore.EndOfStream, eventstore.Backwards, 1)
	switch {
	case errors.Is(err, eventstore.ErrStreamNotFound):
		return nf
	case err != nil:
		return fmt.Errorf("kurrentdb: read %q: not found, and its metadata, which tells a soft-deleted stream from one never written, cannot be read: %w", stream, err)
	case len(evs) == 1 && softDeleted(evs[0].Data):
		return fmt.Errorf("kurrentdb: read %q: %w: the stream is soft-deleted (its metadata's $tb is the deleted marker): reads hide its events, the server still holds them", stream, ErrStreamTruncated)
	}
	return nf
}

// tombstoned is the answer to a read of a tombstoned (hard-deleted) stream.
// Outside $ it is not ErrStreamNotFound: the stream's events stay in $all and
// in what was built from them, and a caller that took it for new would answer
// the resend of a command it had applied as for a missing account.
func tombstoned(stream string) error {
	if strings.HasPrefix(stream, "$") {
		return fmt.Errorf("kurrentdb: read %q: %w: %w", stream, eventstore.ErrStreamNotFound, ErrStreamDeleted)
	}
	return fmt.Errorf("kurrentdb: read %q: %w: tombstoned, its events are in $all but no read or write of the stream reaches them", stream, ErrStreamDeleted)
}

// softDeleted reports stream metadata whose $tb is the server's deleted
// marker (EventNumber.DeletedStream, the largest int64), as its soft delete
// writes it.
func softDeleted(meta []byte) bool {
	var m struct {
		TB json.Number `json:"$tb"`
	}
	if json.Unmarshal(meta, &m) != nil {
		return false
	}
	tb, err := m.TB.Int64()
	return err == nil && tb == math.MaxInt64
}

// drainRecords reads rs to its end, and closes it. An attempt that fails
// part-way gives nothing: the store's retry (do) reads again from the start.
func drainRecords(rs *esdb.ReadStream) ([]eventstore.RecordedEvent, error) {
	defer rs.Close()
	var out []eventstore.RecordedEvent
	for {
		switch ev, err := rs.Recv(); {
		case err == nil:
			out = append(out, toRecorded(ev.OriginalEvent()))
		case errors.Is(err, io.EOF):
			return out, nil
		default:
			return nil, err
		}
	}
}

// readAllPage reads up to count records of $all, system records included.
func (s *Store) readAllPage(ctx context.Context, from esdb.AllPosition, dir esdb.Direction, count uint64) ([]eventstore.RecordedEvent, error) {
	var out []eventstore.RecordedEvent
	err := s.do(ctx, func(ctx context.Context, c *esdb.Client) error {
		rs, err := c.ReadAll(ctx, esdb.ReadAllOptions{Direction: dir, From: from}, count)
		if err != nil {
			return err
		}
		out, err = drainRecords(rs)
		return err
	})
	if err != nil {
		return nil, mapError(ctx, err, "read $all")
	}
	return out, nil
}

func allFrom(p eventstore.Position) esdb.AllPosition {
	if p == eventstore.Start {
		return esdb.Start{}
	}
	return esdb.Position{Commit: p.Commit, Prepare: p.Prepare}
}

// ReadAll returns up to max events (max <= 0: all) strictly after the position,
// in commit order, leaving out system records. KurrentDB commits in log order,
// so a later-visible event never lands at an earlier position.
func (s *Store) ReadAll(ctx context.Context, after eventstore.Position, max int) ([]eventstore.RecordedEvent, error) {
	var out []eventstore.RecordedEvent
	last, haveLast := after, after != eventstore.Start
	for {
		want := uint64(math.MaxUint64)
		if max > 0 {
			want = uint64(max-len(out)) + 1 // +1: a read from a position includes it
		}
		from := esdb.AllPosition(esdb.Start{})
		if haveLast {
			from = allFrom(last)
		}
		page, err := s.readAllPage(ctx, from, esdb.Forwards, want)
		if err != nil {
			return nil, err
		}
		for _, e := range page {
			if haveLast && e.Position.Compare(last) <= 0 {
				continue
			}
			last, haveLast = e.Position, true
			if isSystem(e.Stream, e.Type) {
				continue
			}
			out = append(out, e)
			if max > 0 && len(out) == max {
				return out, nil
			}
		}
		if uint64(len(page)) < want {
			return out, nil
		}
	}
}

// Head is the position of the last non-system event of $all (Start when none).
func (s *Store) Head(ctx context.Context) (eventstore.Position, error) {
	from := esdb.AllPosition(esdb.End{})
	var bound eventstore.Position
	haveBound := false
	for {
		page, err := s.readAllPage(ctx, from, esdb.Backwards, headPageSize)
		if err != nil {
			return eventstore.Position{}, err
		}
		progressed := false
		for _, e := range page {
			if haveBound && e.Position.Compare(bound) >= 0 {
				continue
			}
			bound, haveBound, progressed = e.Position, true, true
			if !isSystem(e.Stream, e.Type) {
				return e.Position, nil
			}
		}
		if len(page) < headPageSize || !progressed {
			return eventstore.Start, nil
		}
		from = allFrom(bound)
	}
}
