package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/domain"
)

// Subjects of the protocol (PROTOCOL.md §2, §4).
const (
	CommandSubjectPrefix = "ledger.v1.cmd."
	QuerySubjectPrefix   = "ledger.v1.query."
	// BatchSubject carries ledger.v1.cmd.batch (§2.2).
	BatchSubject = CommandSubjectPrefix + "batch"
)

// Limits of a batch (PROTOCOL.md §2.2): the automatic batching keeps within
// them; an explicit Batch outside them is answered invalid by the ledger. They
// are the ledger's own limits (package domain decides by them), not copies.
const (
	MaxBatchCommands = domain.MaxBatchCommands
	MaxBatchPostings = domain.MaxBatchPostings
	MaxBatchBytes    = domain.MaxBatchBodyBytes
	// MaxCommandBytes is the limit of one command's body (§2): a bigger one is
	// sent alone, never in a batch, and answered invalid.
	MaxCommandBytes = domain.MaxBodyBytes
)

// Defaults of the options.
const (
	DefaultLinger         = time.Millisecond
	DefaultMaxInFlight    = 8
	DefaultAttemptTimeout = 10 * time.Second
	DefaultBackoffMin     = 20 * time.Millisecond
	DefaultBackoffMax     = 2 * time.Second
)

// Client sends commands and queries to the ledger over one NATS connection.
// It is safe for concurrent use; concurrent calls are what it batches.
type Client struct {
	nc  *nats.Conn
	o   options
	mux *mux
	b   *batcher // nil without batching
}

type options struct {
	batching       bool
	linger         time.Duration
	maxBatch       int
	maxInFlight    int
	attemptTimeout time.Duration
	backoffMin     time.Duration
	backoffMax     time.Duration
	log            *slog.Logger
	onResend       func(key string, attempt int, why error)
}

// Option configures New.
type Option func(*options)

// WithoutBatching sends every command in a request of its own, never in a
// ledger.v1.cmd.batch (the explicit Batch still sends batches).
func WithoutBatching() Option { return func(o *options) { o.batching = false } }

// WithLinger sets how long a call waits for others to join its batch while
// earlier requests of the client are still unanswered (default
// DefaultLinger). A call made when nothing is in flight is sent at once, so a
// caller alone never waits for it.
func WithLinger(d time.Duration) Option { return func(o *options) { o.linger = max(0, d) } }

// WithMaxBatch bounds the commands of one automatic batch (default and at most
// MaxBatchCommands; it is also bounded by MaxBatchBytes and MaxBatchPostings).
func WithMaxBatch(n int) Option {
	return func(o *options) { o.maxBatch = min(max(1, n), MaxBatchCommands) }
}

// WithMaxInFlight bounds the automatic batches awaiting their replies at once
// (default DefaultMaxInFlight); calls made meanwhile wait and join the next.
func WithMaxInFlight(n int) Option { return func(o *options) { o.maxInFlight = max(1, n) } }

// WithAttemptTimeout sets how long one attempt waits for its reply before the
// command is resent with the same key (default DefaultAttemptTimeout).
func WithAttemptTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.attemptTimeout = d
		}
	}
}

// WithBackoff sets the pause before resending after an infrastructure error
// or when no ledger is subscribed: it starts at lo and doubles up to hi, with
// jitter (defaults DefaultBackoffMin, DefaultBackoffMax). A resend after an
// attempt timed out is made at once.
func WithBackoff(lo, hi time.Duration) Option {
	return func(o *options) {
		if lo > 0 {
			o.backoffMin = lo
		}
		o.backoffMax = max(o.backoffMin, hi)
	}
}

// WithResendHook calls f before each resend, on the caller's goroutine, with
// the key, the number of the attempt that got no definite answer (from 1) and
// why (ErrAttemptTimeout, ErrNoResponders, a *ReplyError...): for tools that
// count what the retries hid.
func WithResendHook(f func(key string, attempt int, why error)) Option {
	return func(o *options) { o.onResend = f }
}

// WithLogger logs resends (at debug level) and undecodable replies (warn).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// New returns a Client on nc. The caller keeps nc and closes it after the
// client's last call.
func New(nc *nats.Conn, opts ...Option) *Client {
	o := options{
		batching: true, linger: DefaultLinger, maxBatch: MaxBatchCommands, maxInFlight: DefaultMaxInFlight,
		attemptTimeout: DefaultAttemptTimeout, backoffMin: DefaultBackoffMin, backoffMax: DefaultBackoffMax,
		log: slog.New(slog.DiscardHandler),
	}
	for _, opt := range opts {
		opt(&o)
	}
	c := &Client{nc: nc, o: o, mux: newMux(nc)}
	if o.batching && o.maxBatch > 1 {
		c.b = newBatcher(c)
	}
	return c
}

// Close ends the client's subscription to its replies. A call made after it
// returns an *IndefiniteError at once (wrapping ErrClosed); calls still
// waiting end when their contexts do. It does not close the connection.
func (c *Client) Close() error { return c.mux.close() }

// StoredAck is JetStream's acknowledgement that LEDGER_COMMANDS stored a
// command (the stream captures the command subjects). A ledger will decide a
// stored command even if no one resends it.
type StoredAck struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

// IndefiniteError is the error of a call that got no definite answer before
// its context ended: the command may or may not have been decided. Call again
// with the same key (or ask Queries().Command) to learn the outcome.
type IndefiniteError struct {
	Key      string
	Attempts int
	// Stored is set when JetStream confirmed the command is in its stream: a
	// ledger will decide it.
	Stored *StoredAck
	// Last is why the last attempt got no definite answer.
	Last error
	// Err is the context's error, or why no resend could succeed (ErrClosed,
	// a closed connection, a request over the server's max payload).
	Err error
}

func (e *IndefiniteError) Error() string {
	s := fmt.Sprintf("client: no definite answer for key %q after %d attempt(s) (%v", e.Key, e.Attempts, e.Err)
	if e.Last != nil {
		s += "; last: " + e.Last.Error()
	}
	s += "): the outcome is unknown, send it again with the same key"
	if e.Stored != nil {
		s += fmt.Sprintf("; it is stored in %s as message %d and will be decided", e.Stored.Stream, e.Stored.Seq)
	}
	return s
}

func (e *IndefiniteError) Unwrap() []error {
	if e.Last == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Last}
}

// Why an attempt got no definite answer.
var (
	// ErrAttemptTimeout: no reply within the attempt timeout.
	ErrAttemptTimeout = errors.New("client: no reply within the attempt timeout")
	// ErrNoResponders: nothing subscribes to the subject (no ledger running).
	ErrNoResponders = errors.New("client: no ledger answers the subject")
)

// ReplyError is an attempt answered status error (an infrastructure failure on
// the ledger's side): the client resends.
type ReplyError struct {
	Code    Code
	Message string
}

func (e *ReplyError) Error() string { return fmt.Sprintf("ledger error %s: %s", e.Code, e.Message) }

// outcome is what one attempt got.
type outcome struct {
	raw    []byte     // the ledger's reply
	stored *StoredAck // JetStream's ack, when one came
	err    error      // why there is no reply
	// wait: resend after a pause (an error reply, no responders), not at once.
	wait bool
	// alone: resend the command in a request of its own, not in a batch.
	alone bool
	// final: no resend can succeed (the request cannot be published).
	final bool
}

// do runs cmd until its answer is definite or ctx ends: the protocol's resend
// rule, in one place for every command of this package.
func (c *Client) do(ctx context.Context, cmd Command) (Reply, error) {
	typ := cmd.commandType()
	body, err := cmd.body()
	if err != nil {
		return Reply{}, fmt.Errorf("client: encode %s: %w", typ, err)
	}
	var elem []byte
	batchable := false
	if c.b != nil && len(body) <= MaxCommandBytes {
		elem, batchable = element(typ, body)
	}
	r := resender{c: c, cmd: cmd}
	for {
		var out outcome
		if batchable && !c.b.unsupported.Load() {
			out = c.b.attempt(ctx, &call{typ: typ, body: body, elem: elem, postings: postings(cmd)})
			batchable = !out.alone
		} else {
			out = c.request(ctx, CommandSubjectPrefix+typ, body)
		}
		var rep Reply
		if ok, next := settled(out, &rep); ok {
			return rep, nil
		} else if err := r.next(ctx, next); err != nil {
			return Reply{}, err
		}
	}
}

// answer is a reply the resend rule reads: Reply, BatchReply.
type answer interface {
	head() (Status, Code, string)
}

func (r *Reply) head() (Status, Code, string)      { return r.Status, r.Code, r.Message }
func (r *BatchReply) head() (Status, Code, string) { return r.Status, r.Code, r.Message }

// settled decodes an attempt's reply into v and reports whether it is a
// definite answer; when it is not, next is the attempt's outcome as the
// resender takes it (why, and whether to pause).
func settled(out outcome, v answer) (ok bool, next outcome) {
	if out.raw == nil {
		return false, out
	}
	if err := json.Unmarshal(out.raw, v); err != nil {
		return false, outcome{err: fmt.Errorf("client: undecodable reply %.200q: %w", out.raw, err), wait: true, stored: out.stored}
	}
	st, code, msg := v.head()
	if st.Definite() {
		return true, out
	}
	return false, outcome{err: &ReplyError{Code: code, Message: msg}, wait: true, stored: out.stored}
}

// resender keeps the state of one command's resends.
type resender struct {
	c   *Client
	key string
	// cmd, when set, gives key once a resend needs it: a Raw's key is a
	// decoding of its body, which an answered first attempt never reads.
	cmd      Command
	attempts int
	stored   *StoredAck
	last     error // why the last attempt that ran its course got no answer
	pause    time.Duration
}

// name is the key the attempts are sent under.
func (r *resender) name() string {
	if r.cmd != nil {
		r.key, r.cmd = r.cmd.key(), nil
	}
	return r.key
}

// next records an attempt without a definite answer and waits before the next
// one; it returns the IndefiniteError once ctx has ended.
func (r *resender) next(ctx context.Context, out outcome) error {
	r.attempts++
	if out.stored != nil {
		r.stored = out.stored
	}
	if out.err != nil && (ctx.Err() == nil || !errors.Is(out.err, ctx.Err())) {
		r.last = out.err
	}
	fail := func() error {
		why := ctx.Err()
		if why == nil {
			why = r.last
		}
		return &IndefiniteError{Key: r.name(), Attempts: r.attempts, Stored: r.stored, Last: r.last, Err: why}
	}
	if ctx.Err() != nil || errors.Is(out.err, ErrClosed) || out.final {
		return fail()
	}
	r.c.o.log.Debug("resend", "key", r.name(), "attempt", r.attempts, "why", out.err)
	if r.c.o.onResend != nil {
		r.c.o.onResend(r.name(), r.attempts, out.err)
	}
	if !out.wait {
		r.pause = 0
		return nil
	}
	r.pause = min(max(2*r.pause, r.c.o.backoffMin), r.c.o.backoffMax)
	d := r.pause/2 + rand.N(r.pause/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fail()
	case <-t.C:
		return nil
	}
}

// request makes one attempt of a request on subject and waits for its reply,
// at most the attempt timeout.
func (c *Client) request(ctx context.Context, subject string, body []byte) outcome {
	w := c.mux.register()
	defer c.mux.unregister(w)
	if err := c.mux.err(); err != nil {
		if errors.Is(err, ErrClosed) {
			return outcome{err: err}
		}
		return outcome{err: errSubscribe(err), wait: true}
	}
	if err := c.nc.PublishMsg(&nats.Msg{Subject: subject, Reply: w.subject, Data: body}); err != nil {
		// Over the server's max payload, or on a closed connection, no resend
		// can succeed: the call ends (errFinal); a batch goes again element by
		// element (alone).
		final := errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrConnectionClosed)
		return outcome{err: fmt.Errorf("client: publish %s: %w", subject, err), wait: !final, final: final}
	}
	return w.wait(ctx, c.o.attemptTimeout)
}

// Deposit sends a deposit.
func (c *Client) Deposit(ctx context.Context, cmd Deposit) (Reply, error) { return c.do(ctx, cmd) }

// OpenAccount sends an open_account.
func (c *Client) OpenAccount(ctx context.Context, cmd OpenAccount) (Reply, error) {
	return c.do(ctx, cmd)
}

// Withdraw sends a withdraw.
func (c *Client) Withdraw(ctx context.Context, cmd Withdraw) (Reply, error) { return c.do(ctx, cmd) }

// Transfer sends a transfer.
func (c *Client) Transfer(ctx context.Context, cmd Transfer) (Reply, error) { return c.do(ctx, cmd) }

// PlaceHold sends a place_hold.
func (c *Client) PlaceHold(ctx context.Context, cmd PlaceHold) (Reply, error) {
	return c.do(ctx, cmd)
}

// CaptureHold sends a capture_hold.
func (c *Client) CaptureHold(ctx context.Context, cmd CaptureHold) (Reply, error) {
	return c.do(ctx, cmd)
}

// ReleaseHold sends a release_hold.
func (c *Client) ReleaseHold(ctx context.Context, cmd ReleaseHold) (Reply, error) {
	return c.do(ctx, cmd)
}

// Refund sends a refund.
func (c *Client) Refund(ctx context.Context, cmd Refund) (Reply, error) { return c.do(ctx, cmd) }

// CloseAccount sends a close_account.
func (c *Client) CloseAccount(ctx context.Context, cmd CloseAccount) (Reply, error) {
	return c.do(ctx, cmd)
}

// PostTransaction sends a post_transaction.
func (c *Client) PostTransaction(ctx context.Context, cmd PostTransaction) (Reply, error) {
	return c.do(ctx, cmd)
}

// Send sends any Command (a Raw body included) by the same rules as the
// typed methods.
func (c *Client) Send(ctx context.Context, cmd Command) (Reply, error) { return c.do(ctx, cmd) }
