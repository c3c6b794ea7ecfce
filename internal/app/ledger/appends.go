package ledger

import (
	"context"
	"errors"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// How the write path appends is a capability of the store, chosen once in New
// (appenderFor, ARCHITECTURE decision 16): a store that appends to one stream
// a write (streamAppends), one that appends to several streams in one write
// (multiAppends), or one that does so through group commit (groupAppends,
// batch.go), whose writes are pipelined on their hot account (pipeline.go).
// Command code asks no capability question: it calls the appender.
type appender interface {
	// one appends a single stream's part.
	one(ctx context.Context, part eventstore.StreamAppend) (eventstore.AppendResult, error)
	// parts appends parts in one atomic write; only the atomic mover calls
	// it, on a store that appends to several streams at once.
	parts(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error)
	// withClaim writes a key's claim and its home stream's events: in one
	// write where the store can, otherwise the claim first (a crash in
	// between leaves a claim that the retry of the same request passes
	// through idempotently); the home's result.
	withClaim(ctx context.Context, claim, home eventstore.StreamAppend) (eventstore.AppendResult, error)
	// account appends w's decision on its account (events) and folds it into
	// the aggregate: pipelined (its lock released while it commits), or
	// under the lock throughout.
	account(ctx context.Context, l *heldLocks, w *accountWrite, events []domain.NewEvent) (written, error)
	// hot names the stream among ids' that a write over several accounts is
	// pipelined on; "" where nothing is.
	hot(ids []string) string
	// afterEarlier waits, before a command of a batch is decided again, for
	// the earlier commands it shares something with (batches.go); only a
	// store that pipelines decides a command before an earlier one finished.
	afterEarlier(ctx context.Context, a *attempt) error
	close()
}

// appenderFor is the appender the store's capabilities call for.
func appenderFor(s *Service, store Store) appender {
	m, ok := store.(eventstore.MultiAppender)
	switch {
	case !ok:
		return streamAppends{s}
	case s.opts.DisableGroupCommit:
		return multiAppends{streamAppends{s}, m}
	}
	s.batch = newBatcher(m, s.opts.Batch, s.metrics.batchSize)
	return groupAppends{multiAppends{streamAppends{s}, m}}
}

// errNotMulti is an atomic write asked of a store that appends to one stream
// at a time: the mover chosen for such a store asks none (a bug).
var errNotMulti = errors.New("ledger: an atomic write over several streams on a store that appends to one stream at a time")

// streamAppends appends to one stream a write.
type streamAppends struct{ s *Service }

func (a streamAppends) one(ctx context.Context, part eventstore.StreamAppend) (eventstore.AppendResult, error) {
	return a.s.store.Append(ctx, part.Stream, part.Expected, part.Events)
}

func (streamAppends) parts(context.Context, []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	return nil, errNotMulti
}

func (a streamAppends) withClaim(ctx context.Context, claim, home eventstore.StreamAppend) (eventstore.AppendResult, error) {
	if _, err := a.one(ctx, claim); err != nil {
		return eventstore.AppendResult{}, err
	}
	return a.one(ctx, home)
}

func (a streamAppends) account(ctx context.Context, _ *heldLocks, w *accountWrite, events []domain.NewEvent) (written, error) {
	return a.s.appendAccount(ctx, w, events)
}

func (streamAppends) hot([]string) string { return "" }

func (streamAppends) afterEarlier(context.Context, *attempt) error { return nil }

func (streamAppends) close() {}

// multiAppends appends to several streams in one write, each command in a
// transaction of its own.
type multiAppends struct {
	streamAppends
	m eventstore.MultiAppender
}

func (a multiAppends) parts(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	return a.m.AppendMulti(ctx, parts)
}

func (a multiAppends) withClaim(ctx context.Context, claim, home eventstore.StreamAppend) (eventstore.AppendResult, error) {
	return withClaimIn(ctx, a.parts, claim, home)
}

// withClaimIn writes claim and home in one write of parts.
func withClaimIn(ctx context.Context, parts func(context.Context, []eventstore.StreamAppend) ([]eventstore.AppendResult, error), claim, home eventstore.StreamAppend) (eventstore.AppendResult, error) {
	res, err := parts(ctx, []eventstore.StreamAppend{claim, home})
	if err != nil {
		return eventstore.AppendResult{}, err
	}
	return res[1], nil
}

// groupAppends appends through group commit (Service.batch): several
// commands share a transaction, and a write is pipelined on its hot account.
// A command over several accounts may share a transaction with others: it
// holds its accounts' locks and has drained their appends in flight, so no
// other request of the batch names its accounts, and a refusal names it alone.
type groupAppends struct{ multiAppends }

func (a groupAppends) one(ctx context.Context, part eventstore.StreamAppend) (eventstore.AppendResult, error) {
	rs, err := a.s.batch.submit(ctx, []eventstore.StreamAppend{part})
	if err != nil {
		return eventstore.AppendResult{}, err
	}
	return rs[0], nil
}

func (a groupAppends) parts(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	return a.s.batch.submit(ctx, parts)
}

func (a groupAppends) withClaim(ctx context.Context, claim, home eventstore.StreamAppend) (eventstore.AppendResult, error) {
	return withClaimIn(ctx, a.parts, claim, home)
}

func (a groupAppends) account(ctx context.Context, l *heldLocks, w *accountWrite, events []domain.NewEvent) (written, error) {
	return a.s.appendPipelined(ctx, l, w, events)
}

func (a groupAppends) hot(ids []string) string { return a.s.pickHot(ids) }

func (a groupAppends) afterEarlier(ctx context.Context, at *attempt) error {
	return a.s.afterEarlier(ctx, at)
}

func (a groupAppends) close() { a.s.batch.close() }
