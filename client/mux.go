package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// mux routes replies to their attempts: one wildcard subscription on the
// client's own inbox prefix, one token per attempt (as nats.go's request mux
// does, with the PubAck of the stream that captures the command subjects and
// late replies handled here).
type mux struct {
	nc     *nats.Conn
	prefix string

	mu      sync.Mutex
	sub     *nats.Subscription
	subErr  error
	next    uint64
	waiting map[string]*waiter
}

// waiter is one attempt awaiting its reply.
type waiter struct {
	subject string
	msgs    chan *nats.Msg
}

// waiterBuffer bounds the messages queued for one attempt: a PubAck and the
// reply, or copies delivered again after a reconnect. More are dropped (the
// attempt then times out and the command is resent, same key).
const waiterBuffer = 4

func newMux(nc *nats.Conn) *mux {
	return &mux{nc: nc, prefix: nc.NewRespInbox() + ".", waiting: map[string]*waiter{}}
}

// register returns a waiter with a fresh reply subject. The subscription is
// made on first use; an error making it surfaces on the first wait.
func (m *mux) register() *waiter {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sub == nil && m.subErr == nil {
		m.sub, m.subErr = m.nc.Subscribe(m.prefix+"*", m.deliver)
		if m.subErr == nil {
			m.subErr = m.sub.SetPendingLimits(-1, -1)
		}
	}
	m.next++
	w := &waiter{subject: m.prefix + strconv.FormatUint(m.next, 36), msgs: make(chan *nats.Msg, waiterBuffer)}
	m.waiting[w.subject] = w
	return w
}

func (m *mux) unregister(w *waiter) {
	m.mu.Lock()
	delete(m.waiting, w.subject)
	m.mu.Unlock()
}

// deliver runs on the subscription's goroutine: it only hands the message on.
// A reply to an attempt already given up is dropped: its command was resent.
func (m *mux) deliver(msg *nats.Msg) {
	m.mu.Lock()
	w := m.waiting[msg.Subject]
	m.mu.Unlock()
	if w == nil {
		return
	}
	select {
	case w.msgs <- msg:
	default:
	}
}

func (m *mux) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.subErr == nil {
		m.subErr = ErrClosed
	}
	if m.sub == nil {
		return nil
	}
	err := m.sub.Unsubscribe()
	m.sub = nil
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("client: close: %w", err)
	}
	return nil
}

// ErrClosed is why a call made after Close got no answer.
var ErrClosed = errors.New("client: closed")

func (m *mux) err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.subErr
}

// wait waits for the ledger's reply to the attempt, at most timeout: a
// JetStream PubAck is noted and skipped, a no-responders status ends the
// attempt at once.
func (w *waiter) wait(ctx context.Context, timeout time.Duration) outcome {
	t := time.NewTimer(timeout)
	defer t.Stop()
	var stored *StoredAck
	for {
		select {
		case <-ctx.Done():
			return outcome{stored: stored, err: ctx.Err()}
		case <-t.C:
			return outcome{stored: stored, err: ErrAttemptTimeout}
		case msg := <-w.msgs:
			if msg.Header.Get("Status") == "503" {
				return outcome{stored: stored, err: ErrNoResponders, wait: true}
			}
			if a, isAck := parseStoredAck(msg.Data); isAck {
				if a != nil {
					stored = a
				}
				continue
			}
			return outcome{raw: msg.Data, stored: stored}
		}
	}
}

// parseStoredAck reports whether data is a JetStream publish acknowledgement
// (or its error) and not a ledger reply, which always has a "code"; the ack is
// nil for an error.
func parseStoredAck(data []byte) (*StoredAck, bool) {
	if bytes.HasPrefix(data, replyStart) {
		// A ledger reply, as the ledger writes them (status first); an ack
		// has no status. Not decoded twice: probing a batch's reply of 100
		// elements here cost 3.4% of ledger bench's batch phase (BENCHMARKS.md).
		return nil, false
	}
	var probe struct {
		Code   json.RawMessage `json:"code"`
		Stream *string         `json:"stream"`
		Seq    uint64          `json:"seq"`
		Dup    bool            `json:"duplicate"`
		Error  json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &probe) != nil || probe.Code != nil {
		return nil, false
	}
	switch {
	case probe.Error != nil:
		return nil, true
	case probe.Stream != nil:
		return &StoredAck{Stream: *probe.Stream, Seq: probe.Seq, Duplicate: probe.Dup}, true
	}
	return nil, false
}

// replyStart is how a ledger reply begins (natsapi's appendOutcome).
var replyStart = []byte(`{"status":`)

// errSubscribe wraps the mux's subscription error.
func errSubscribe(err error) error {
	return fmt.Errorf("client: subscribe to the reply inbox: %w", err)
}
