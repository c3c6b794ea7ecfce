package ledger

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/eventstore"
)

// Group commit. Commands for different streams that arrive together are appended
// in one transaction of a MultiAppender, and each caller gets its own result only
// after that transaction commits. A batch is bounded in commands and in wait: a
// committer takes what is queued, waits at most MaxWait for more while the batch is
// below MaxBatch, and commits. While one batch commits the next one fills, so under
// load batches grow by themselves and a lone command waits for nobody.
//
// A batch whose append is refused for one stream (wrong expected revision) hands
// that error to the one command that owns the stream and commits the rest without
// it; any other failure falls back to appending each command alone, so one bad
// command never fails its batch-mates.

// BatchOptions bound group commit.
type BatchOptions struct {
	MaxBatch   int           // commands per transaction (default 256)
	MaxWait    time.Duration // extra wait for a batch to fill (default 0: take what is queued)
	Committers int           // transactions in flight at once (default 2)
	QueueLen   int           // pending commands before callers block (default 4096)
}

type appendReq struct {
	ctx   context.Context
	parts []eventstore.StreamAppend
	done  chan appendResp
}

type appendResp struct {
	res []eventstore.AppendResult
	err error
}

type batcher struct {
	multi eventstore.MultiAppender
	opts  BatchOptions
	queue chan *appendReq
	wg    sync.WaitGroup
	stop  chan struct{}
	once  sync.Once
}

var batchSize = prometheus.NewHistogram(prometheus.HistogramOpts{
	Namespace: "ledger", Name: "group_commit_batch_commands",
	Help:    "Commands carried by one group-commit transaction.",
	Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
})

func init() { prometheus.MustRegister(batchSize) }

func newBatcher(multi eventstore.MultiAppender, opts BatchOptions) *batcher {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 256
	}
	if opts.Committers <= 0 {
		opts.Committers = 2
	}
	if opts.QueueLen <= 0 {
		opts.QueueLen = 4096
	}
	b := &batcher{multi: multi, opts: opts, queue: make(chan *appendReq, opts.QueueLen), stop: make(chan struct{})}
	for i := 0; i < opts.Committers; i++ {
		b.wg.Add(1)
		go b.loop()
	}
	return b
}

// close stops the committers after the queue drains. Callers must not submit after.
func (b *batcher) close() {
	b.once.Do(func() { close(b.stop) })
	b.wg.Wait()
}

// submit appends parts atomically, in a shared transaction when others are queued.
func (b *batcher) submit(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	r := &appendReq{ctx: ctx, parts: parts, done: make(chan appendResp, 1)}
	select {
	case b.queue <- r:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.stop:
		return nil, errBatcherClosed
	}
	// Once queued, the outcome is waited for even if ctx ends: the append may
	// commit, and the caller must learn it rather than guess.
	resp := <-r.done
	return resp.res, resp.err
}

var errBatcherClosed = errors.New("ledger: group commit is closed")

func (b *batcher) loop() {
	defer b.wg.Done()
	var carry []*appendReq // requests deferred because their streams overlapped a batch
	for {
		var batch []*appendReq
		batch, carry = append(batch, carry...), nil
		if len(batch) == 0 {
			select {
			case r := <-b.queue:
				batch = append(batch, r)
			case <-b.stop:
				b.drain()
				return
			}
		}
		batch = b.fill(batch)
		batch, carry = splitOverlaps(batch)
		b.commit(batch)
	}
}

// fill adds queued requests up to MaxBatch, waiting at most MaxWait for more.
func (b *batcher) fill(batch []*appendReq) []*appendReq {
	var deadline <-chan time.Time
	if b.opts.MaxWait > 0 {
		t := time.NewTimer(b.opts.MaxWait)
		defer t.Stop()
		deadline = t.C
	}
	for len(batch) < b.opts.MaxBatch {
		select {
		case r := <-b.queue:
			batch = append(batch, r)
			continue
		default:
		}
		if deadline == nil {
			return batch
		}
		select {
		case r := <-b.queue:
			batch = append(batch, r)
		case <-deadline:
			return batch
		}
	}
	return batch
}

// drain answers what is still queued at shutdown, one by one.
func (b *batcher) drain() {
	for {
		select {
		case r := <-b.queue:
			b.commit([]*appendReq{r})
		default:
			return
		}
	}
}

// splitOverlaps keeps the first request for each stream in the batch and defers
// the rest: one transaction may write a stream only once. (Commands for one
// account are serialised before they get here; two different requests claiming
// the same key are the case this guards.)
func splitOverlaps(batch []*appendReq) (keep, deferred []*appendReq) {
	seen := map[string]bool{}
next:
	for _, r := range batch {
		for _, p := range r.parts {
			if seen[p.Stream] {
				deferred = append(deferred, r)
				continue next
			}
		}
		for _, p := range r.parts {
			seen[p.Stream] = true
		}
		keep = append(keep, r)
	}
	return keep, deferred
}

// commit appends a batch in one transaction, peeling off a request whose stream
// refuses and retrying the rest, bounded by the batch's size.
func (b *batcher) commit(batch []*appendReq) {
	for len(batch) > 0 {
		live := batch[:0]
		for _, r := range batch {
			if r.ctx.Err() != nil { // nobody waits for it and nothing was written
				r.done <- appendResp{err: r.ctx.Err()}
				continue
			}
			live = append(live, r)
		}
		batch = live
		if len(batch) == 0 {
			return
		}
		var parts []eventstore.StreamAppend
		for _, r := range batch {
			parts = append(parts, r.parts...)
		}
		// The transaction is not tied to one caller's context: it carries others.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := b.multi.AppendMulti(ctx, parts)
		cancel()
		if err == nil {
			batchSize.Observe(float64(len(batch)))
			for _, r := range batch {
				r.done <- appendResp{res: res[:len(r.parts)]}
				res = res[len(r.parts):]
			}
			return
		}
		var wrong *eventstore.WrongExpectedRevisionError
		if errors.As(err, &wrong) {
			if i := owner(batch, wrong.Stream); i >= 0 {
				batch[i].done <- appendResp{err: err}
				batch = append(batch[:i], batch[i+1:]...)
				continue
			}
		}
		if len(batch) == 1 {
			batch[0].done <- appendResp{err: err}
			return
		}
		for _, r := range batch { // unknown culprit: each alone
			b.commit([]*appendReq{r})
		}
		return
	}
}

func owner(batch []*appendReq, stream string) int {
	for i, r := range batch {
		for _, p := range r.parts {
			if p.Stream == stream {
				return i
			}
		}
	}
	return -1
}
