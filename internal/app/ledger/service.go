package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/platform/workers"
)

// Store is what the command handler needs of an event store. A store that also
// implements eventstore.MultiAppender writes a key claim and its decision in one
// transaction; otherwise the claim is written first (each step is idempotent).
type Store interface {
	eventstore.Appender
	eventstore.StreamReader
}

// Options configure a Service. Zero values take the defaults.
type Options struct {
	// Clock gives the time a command is accepted at (default time.Now). Tests
	// drive it; the domain never reads a clock itself.
	Clock func() time.Time
	// MaxAttempts bounds decide-and-append attempts on concurrent writes (default 8).
	MaxAttempts int
	// CacheSize bounds the number of account aggregates kept in memory (default 100,000).
	CacheSize int
	// CacheBytes bounds the estimated heap of the cached account aggregates
	// (default 512 MiB; negative: no bound but CacheSize).
	CacheBytes int64
	// RecentKeys bounds the key records each cached account keeps, on a store
	// that locates events (older keys are answered from the store): default
	// 1,024; negative keeps every key. A store that locates no events keeps
	// every key whatever it says.
	RecentKeys int
	// RecentHolds bounds the closed holds each cached account keeps, on a
	// store that reads events by subject (a closed hold not kept is found by
	// its events' subject): default 1,024; negative keeps every hold. Active
	// holds are always kept. A store that reads no subjects keeps every hold.
	RecentHolds int
	// RecentRefunds bounds the refunded originals each cached account keeps
	// the refunded sum of, on a store that reads events by subject (the sum of
	// one not kept is found from its refunds' subject): default 1,024;
	// negative keeps every one. A store that reads no subjects keeps them all.
	RecentRefunds int
	// WarmAccounts, when > 0, loads up to this many of the store's accounts
	// into the cache in the background after New (warm.go): never more than
	// nine tenths of CacheSize and CacheBytes. 0: none.
	WarmAccounts int
	// ResidentAccounts bounds the accounts kept in compact form apart from
	// the cache (residents.go): those the cache dropped and those warmed
	// beyond it. Default 2,000,000 (about 200 bytes each, docs/design.md);
	// negative: none.
	ResidentAccounts int
	// SnapshotEvery is the number of events between snapshots of an account, on
	// a store that keeps snapshots (default 1,000; negative: none are taken;
	// existing ones are still read).
	SnapshotEvery int
	// Producer names this instance in event metadata (diagnostics only).
	Producer string
	Logger   *slog.Logger
	// DisableGroupCommit appends each command in its own transaction even when the
	// store can carry several (group commit is on by default for such stores).
	DisableGroupCommit bool
	// Batch bounds group commit.
	Batch BatchOptions
	// Metrics receives the service's Prometheus metrics (metrics.go); nil
	// registers them nowhere.
	Metrics prometheus.Registerer
}

// Service decides commands. It is safe for concurrent use; commands for one
// stream are serialised, different streams proceed in parallel.
type Service struct {
	store Store
	// appends is how the store appends (appends.go); batch is group
	// commit's, where the store group-commits (groupAppends).
	appends appender
	// durable is the store's when its readers may see writes not yet durable
	// (a duplicate's reply and a lookup wait for them: answered), otherwise
	// alreadyDurable.
	durable  eventstore.DurableReader
	batch    *batcher
	opts     Options
	log      *slog.Logger
	locks    *streamLocks
	pipes    *pipes
	accounts *accountCache
	// residents are the accounts not cached, in compact form (residents.go).
	residents *residents
	// claims keeps claims read from the store: a claim never changes once written.
	claims *lru.Cache[string, *domain.KeyClaimed]
	// transfers caches transfer aggregates (transfers.go), like accounts: an
	// entry is only touched under its stream's lock; a stale one is caught by
	// the expected revision of the next append and refreshed.
	transfers *lru.Cache[string, *domain.Transfer]
	metrics   *metrics
	// mover moves money over several accounts as the store allows (mover.go).
	mover mover
	// transferReads reads the transfer a command is decided on, as the store
	// allows (transfers.go).
	transferReads transferReads
	// repeats tells an append to an account or a transfer that the store
	// took for a repeat of another decision's events (repeats.go).
	repeats repeatFinder
	// keys finds what aggregates forgot of a key, as the store allows
	// (keys.go); snaps is the store's when it keeps snapshots, otherwise
	// noSnapshots (history.go); keyLimit is Account.KeyLimit for new
	// aggregates.
	keys     keyFinder
	cold     coldLoader // how an aggregate not cached is read (coldloads.go)
	snaps    snapshots
	keyLimit int
	// subjects is the store's, when it reads events by subject, otherwise
	// noSubjects; holdLimit and refundLimit are Account.HoldLimit and
	// RefundLimit for new aggregates, 0 (forget none) without subjects
	// (history.go).
	subjects    eventstore.SubjectReader
	holdLimit   int
	refundLimit int
	snapSlots   chan struct{}
	snapWG      sync.WaitGroup
	warm        atomic.Pointer[warmer] // loads the store's accounts after a restart (warm.go); nil: none
	// elements runs the commands of batches that are not atomic (batchworkers.go).
	elements *workers.Pool
	// failpoint, when set (by tests only), is called between the steps of a saga
	// with the step's name; an error aborts the handler there, as a crash would.
	failpoint func(step string) error
	// loadHook, when set (by tests only), is called as a decision starts to
	// load an account's (pending) state (loadPending).
	loadHook func(ctx context.Context, stream string)
	// waitHook, when set (by tests only), is called as a command of a batch
	// that is not atomic waits for its turn (waitStart), before each wait:
	// e waits on ch, one of a's channels (ready).
	waitHook func(e, a *batchElement, ch <-chan struct{})
}

// New returns a Service over store.
func New(store Store, opts Options) *Service {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 8
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = 100_000
	}
	if opts.CacheBytes == 0 {
		opts.CacheBytes = 512 << 20
	}
	if opts.RecentKeys == 0 {
		opts.RecentKeys = 1024
	}
	if opts.RecentHolds == 0 {
		opts.RecentHolds = 1024
	}
	if opts.RecentRefunds == 0 {
		opts.RecentRefunds = 1024
	}
	if opts.ResidentAccounts == 0 {
		opts.ResidentAccounts = 2_000_000
	}
	if opts.SnapshotEvery == 0 {
		opts.SnapshotEvery = 1000
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := newMetrics(opts.Metrics)
	s := &Service{store: store, opts: opts, log: opts.Logger, locks: newStreamLocks(), pipes: newPipes(), accounts: newAccountCache(opts.CacheSize, opts.CacheBytes, m.cachedBytes),
		claims: newLRU[string, *domain.KeyClaimed](opts.CacheSize, nil), transfers: newLRU[string, *domain.Transfer](opts.CacheSize, nil), metrics: m, snapSlots: make(chan struct{}, 4), elements: newElementWorkers()}
	s.residents = newResidents(residentsOn(store, opts.ResidentAccounts))
	s.residents.compacted = func(d time.Duration) { m.compaction.Observe(d.Seconds()) }
	s.accounts.evicted = s.toResident
	s.mover = moverFor(s, store)
	s.transferReads = transferReadsFor(s, store)
	s.repeats = repeatsFor(s, store)
	s.keys = keyFinderFor(s, store)
	s.cold = coldLoaderFor(s, store)
	if s.keys.forgets() {
		s.keyLimit = max(opts.RecentKeys, 0)
	}
	s.snaps, s.subjects, s.durable = noSnapshots{}, noSubjects{}, durableFor(store)
	if ss, ok := store.(eventstore.SnapshotStore); ok {
		s.snaps = ss
	} else {
		s.opts.SnapshotEvery = -1 // none are taken
	}
	if sr, ok := store.(eventstore.SubjectReader); ok {
		s.subjects, s.holdLimit, s.refundLimit = sr, max(opts.RecentHolds, 0), max(opts.RecentRefunds, 0)
	}
	s.appends = appenderFor(s, store)
	s.warm.Store(startWarming(s, store, opts.WarmAccounts))
	return s
}

// Close stops group commit after the appends already queued are answered. The
// caller stops sending commands first; the store is the caller's to close.
func (s *Service) Close() {
	s.warm.Load().stop()
	s.appends.close()
	s.snapWG.Wait()
	s.keys.close()
	s.cold.close()
	s.elements.Close()
}

// ErrTooManyConflicts means concurrent writers kept winning for MaxAttempts rounds.
var ErrTooManyConflicts = errors.New("ledger: too many concurrent writes to the same stream")

// HandleRaw decodes a client command body strictly and handles it.
func (s *Service) HandleRaw(ctx context.Context, typ string, body []byte) Reply {
	if typ == string(domain.CmdBatch) {
		return s.HandleBatch(ctx, body, 0)
	}
	cmd, ierr := domain.DecodeCommand(domain.CommandType(typ), body)
	if ierr != nil {
		return reply.Invalid(keyOf(body), ierr)
	}
	return s.Handle(ctx, cmd)
}

// keyOf extracts the idempotency key of a malformed body for the reply, if it can.
func keyOf(body []byte) string {
	var k struct {
		Key string `json:"idempotency_key"`
	}
	if len(body) <= domain.MaxBodyBytes && json.Unmarshal(body, &k) == nil && domain.ValidKey(k.Key) {
		return k.Key
	}
	return ""
}

// Handle decides one validated client command and replies.
func (s *Service) Handle(ctx context.Context, cmd domain.Command) Reply {
	cmd = s.stamped(cmd)
	r, err := s.route(ctx, cmd)
	return s.replyOf(ctx, cmd, r, err)
}

// stamped is cmd with the time it is accepted at, unless it has one.
func (s *Service) stamped(cmd domain.Command) domain.Command {
	if cmd.At.IsZero() {
		cmd.At = s.opts.Clock().UTC()
	}
	return cmd
}

// route decides cmd the way its type takes.
func (s *Service) route(ctx context.Context, cmd domain.Command) (Reply, error) {
	move, moved := moverCommands[cmd.Type]
	switch {
	case !cmd.Type.IsClient():
		return reply.Invalid(cmd.IdempotencyKey, &domain.InvalidError{Field: "type", Message: fmt.Sprintf("unknown command type %q", cmd.Type)}), nil
	case isAccountCommand(cmd):
		return s.handleAccountCommand(ctx, cmd, domain.AccountStream(cmd.AccountID), cmd.AccountID)
	case moved:
		return move(s.mover, ctx, cmd)
	case cmd.Type == domain.CmdTransfer:
		return s.handleTransfer(ctx, cmd)
	case cmd.Type == domain.CmdRefund:
		return s.handleRefund(ctx, cmd)
	}
	return s.mover.captureTo(ctx, cmd) // a capture_hold with `to`
}

// isAccountCommand reports whether cmd, a client command, is decided on its
// own account alone (handleAccountCommand): not a move over several accounts,
// a transfer, a refund, nor a capture into another account.
func isAccountCommand(cmd domain.Command) bool {
	_, moved := moverCommands[cmd.Type]
	switch {
	case moved, cmd.Type == domain.CmdTransfer, cmd.Type == domain.CmdRefund:
		return false
	}
	return cmd.Type != domain.CmdCaptureHold || cmd.To == ""
}

// replyOf is the reply to cmd decided as r, err: a duplicate made durable
// first (answered; a batch's elements once for all, runBatch), an error
// logged and answered as one.
func (s *Service) replyOf(ctx context.Context, cmd domain.Command, r Reply, err error) Reply {
	if err == nil && r.Duplicate && batchElementOf(ctx) == nil {
		err = s.answered(ctx)
	}
	if err != nil {
		s.log.Warn("command failed", "type", cmd.Type, "key", cmd.IdempotencyKey, "err", err)
		return reply.Error(cmd.IdempotencyKey, err)
	}
	return r
}

// answered makes what a reply read from the store as durable as an
// acknowledged write before the reply tells a client it was decided: a key
// decided by a commit whose wait for the synchronous standby was cancelled is
// on the primary alone, and a failover would lose it (eventstore.DurableReader).
func (s *Service) answered(ctx context.Context) error {
	return s.durable.Durable(ctx)
}

// durableFor is the store's DurableReader, or alreadyDurable for a store
// whose readers see durable writes only.
func durableFor(store Store) eventstore.DurableReader {
	if d, ok := store.(eventstore.DurableReader); ok {
		return d
	}
	return alreadyDurable{}
}

// alreadyDurable is the DurableReader of a store whose readers see durable
// writes only: nothing to wait for.
type alreadyDurable struct{}

func (alreadyDurable) Durable(context.Context) error { return nil }
