package ledger

import (
	"context"
	"errors"
	"sync"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/eventstore"
)

// keyLookups asks the store whether events exist for the keys of concurrent
// commands in one request per round (decidedBefore): while resends of forgotten
// keys arrive on a hot account, each of its commands needs the answer, and one
// request per command would cost a round trip each. One goroutine gathers the
// rounds: when a round slot is free it takes what has queued (up to
// maxLookupBatch) and asks in the background, at most lookupRounds at once.
type keyLookups struct {
	locator eventstore.EventLocator
	sizes   prometheus.Observer // keys per request
	queue   chan *lookup
	done    chan struct{}
	stopped chan struct{}
	once    sync.Once
}

// maxLookupBatch bounds the IDs of one request; lookupRounds the requests in
// flight at once (a lookup waits for at most one round ahead of its own).
const (
	maxLookupBatch = 512
	lookupRounds   = 4
)

type lookup struct {
	id    uuid.UUID
	found bool
	err   error
	ready chan struct{}
}

func newKeyLookups(l eventstore.EventLocator, sizes prometheus.Observer) *keyLookups {
	k := &keyLookups{locator: l, sizes: sizes, queue: make(chan *lookup, maxLookupBatch), done: make(chan struct{}), stopped: make(chan struct{})}
	go k.loop()
	return k
}

var errLookupsClosed = errors.New("ledger: key lookups are closed")

// exists reports whether the store holds an event of this ID.
func (k *keyLookups) exists(ctx context.Context, id uuid.UUID) (bool, error) {
	select {
	case <-k.done:
		return false, errLookupsClosed
	default:
	}
	l := &lookup{id: id, ready: make(chan struct{})}
	select {
	case k.queue <- l:
	case <-k.done:
		return false, errLookupsClosed
	case <-ctx.Done():
		return false, ctx.Err()
	}
	select {
	case <-l.ready:
		return l.found, l.err
	case <-k.stopped: // closed with this lookup still queued: nobody will ask
		select {
		case <-l.ready:
			return l.found, l.err
		default:
			return false, errLookupsClosed
		}
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (k *keyLookups) loop() {
	var rounds sync.WaitGroup
	defer func() { rounds.Wait(); close(k.stopped) }()
	inflight := make(chan struct{}, lookupRounds)
	for {
		var batch []*lookup
		select {
		case l := <-k.queue:
			batch = append(batch, l)
		case <-k.done:
			return
		}
		select { // a round slot; lookups queue meanwhile and join this round
		case inflight <- struct{}{}:
		case <-k.done:
			k.answer(batch, nil, errLookupsClosed)
			return
		}
	fill:
		for len(batch) < maxLookupBatch {
			select {
			case l := <-k.queue:
				batch = append(batch, l)
			default:
				break fill
			}
		}
		rounds.Add(1)
		go func() {
			defer func() { <-inflight; rounds.Done() }()
			ids := make([]uuid.UUID, len(batch))
			for i, l := range batch {
				ids[i] = l.id
			}
			// Not tied to one caller's context: the round answers all of them.
			ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
			found, err := k.locator.EventsExist(ctx, ids)
			cancel()
			k.answer(batch, found, err)
			k.sizes.Observe(float64(len(batch)))
		}()
	}
}

func (k *keyLookups) answer(batch []*lookup, found map[uuid.UUID]bool, err error) {
	for _, l := range batch {
		l.found, l.err = found[l.id], err
		close(l.ready)
	}
}

// close stops the loop; lookups queued meanwhile get errLookupsClosed or their
// context's end.
func (k *keyLookups) close() {
	k.once.Do(func() { close(k.done) })
	<-k.stopped
}
