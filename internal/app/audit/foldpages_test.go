package audit

import (
	"context"
	"sync"
	"testing"
	"unsafe"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
)

// pageBlocks lays each read's events' data and metadata out in one block, as
// PostgreSQL's store does (eventstore/postgres's eventBytes), and keeps every
// block it made, so that a test can ask whether the fold holds on to one.
// The fold's reader lays pages out beside the fold: mu guards the blocks.
type pageBlocks struct {
	mu      sync.Mutex
	blocks  [][]byte
	reloads int // of the blocks, those of stream reads
}

func (p *pageBlocks) lay(recs []eventstore.RecordedEvent) []eventstore.RecordedEvent {
	n := 0
	for _, re := range recs {
		n += len(re.Data) + len(re.Metadata)
	}
	block := make([]byte, 0, n)
	out := make([]eventstore.RecordedEvent, len(recs))
	for i, re := range recs {
		out[i] = re
		start := len(block)
		block = append(block, re.Data...)
		out[i].Data = block[start:len(block):len(block)]
		start = len(block)
		block = append(block, re.Metadata...)
		out[i].Metadata = block[start:len(block):len(block)]
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocks = append(p.blocks, block)
	return out
}

// holds reports whether b lies in one of the blocks.
func (p *pageBlocks) holds(b []byte) bool {
	if cap(b) == 0 {
		return false
	}
	at := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, block := range p.blocks {
		start := uintptr(unsafe.Pointer(unsafe.SliceData(block)))
		if at >= start && at < start+uintptr(cap(block)) {
			return true
		}
	}
	return false
}

// blockedPages is heldPages read as pages laid out in blocks.
type blockedPages struct {
	held heldPages
	*pageBlocks
}

func (b blockedPages) ReadAll(ctx context.Context, after eventstore.Position, max int) ([]eventstore.RecordedEvent, error) {
	recs, err := b.held.ReadAll(ctx, after, max)
	return b.lay(recs), err
}

// blockedStore is a memory store whose stream reads (the fold's reloads of
// streams it forgot) are laid out in blocks.
type blockedStore struct {
	*memory.Store
	*pageBlocks
}

func (b blockedStore) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	recs, err := b.Store.ReadStream(ctx, stream, from, dir, max)
	out := b.lay(recs)
	b.mu.Lock()
	b.reloads++
	b.mu.Unlock()
	return out, err
}

// TestFoldKeepsNoPageBlock: what the fold keeps past a page holds none of
// the page's bytes, which a store keeps in blocks of many events: a
// transaction saga decided and not yet settled kept its outcome event's
// data, a slice of its page's block, and so the whole block live (issue 23:
// 29 MB of 119 MB at the end of an audit of 1,000,000 events).
func TestFoldKeepsNoPageBlock(t *testing.T) {
	ctx := context.Background()
	store, held := realisticHistory(t, ctx, 300, 18_000)
	blocks := &pageBlocks{}
	f := NewFold()
	f.sets = noSets{}
	f.Reload = reloader(ctx, blockedStore{store, blocks})
	f.originals = newOriginals(ctx, store)
	pages := blockedPages{held, blocks}
	decided := 0
	check := func(*eventstore.Position) {
		for stream, ts := range f.txSagas {
			if ts.Decided() {
				decided++
				if blocks.holds(ts.Outcome.Data) {
					t.Fatalf("the fold keeps %s's outcome in a page's block", stream)
				}
			}
		}
	}
	if err := foldUntil(ctx, pages, f, foldTo{until: held[len(held)-1].Position, batch: heldBatch, before: check}); err != nil {
		t.Fatal(err)
	}
	check(nil)
	if f.ViolationCount() != 0 {
		t.Fatalf("%d violations in a valid history: %v", f.ViolationCount(), f.Violations[0])
	}
	if decided == 0 {
		t.Fatal("nothing checked: no decided saga kept")
	}
	blocks.mu.Lock()
	defer blocks.mu.Unlock()
	t.Logf("%d decided sagas seen kept, in %d blocks (%d of reloads)", decided, len(blocks.blocks), blocks.reloads)
}
