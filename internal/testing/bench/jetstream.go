package bench

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
)

// publishWindow bounds the unacknowledged publishes of the js-publish phase.
const publishWindow = 512

// jsPollInterval is how often the consumer's progress is read.
const jsPollInterval = 20 * time.Millisecond

type jsProbe struct {
	log      *slog.Logger
	logEvery time.Duration
	nc       *nats.Conn
	js       jetstream.JetStream
	cons     jetstream.Consumer
	str      jetstream.Stream
}

func newJSProbe(ctx context.Context, url string, log *slog.Logger, every time.Duration) (*jsProbe, error) {
	nc, err := nats.Connect(url, nats.Name("bench-jetstream"))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*publishWindow))
	if err != nil {
		nc.Close()
		return nil, err
	}
	str, err := js.Stream(ctx, natsapi.StreamName)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bench: stream %s: %w", natsapi.StreamName, err)
	}
	cons, err := str.Consumer(ctx, natsapi.DefaultDurable)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bench: consumer %s: %w", natsapi.DefaultDurable, err)
	}
	if every <= 0 {
		every = time.Hour
	}
	return &jsProbe{log: log, logEvery: every, nc: nc, js: js, cons: cons, str: str}, nil
}

func (p *jsProbe) close() { p.nc.Close() }

func (p *jsProbe) lastSeq(ctx context.Context) (uint64, error) {
	info, err := p.str.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// waitSettled waits until the consumer has settled every message up to seq.
// onProgress, when set, sees the ack floor at each poll.
func (p *jsProbe) waitSettled(ctx context.Context, seq uint64, timeout time.Duration, onProgress func(floor uint64)) error {
	start := time.Now()
	deadline := start.Add(timeout)
	lastLog, lastFloor := start, uint64(0)
	for {
		info, err := p.cons.Info(ctx)
		if err == nil {
			if onProgress != nil {
				onProgress(info.AckFloor.Stream)
			}
			if p.log != nil && time.Since(lastLog) >= p.logEvery {
				if lastFloor > 0 {
					p.log.Info("bench: consumer settling", "ack_floor", info.AckFloor.Stream, "target", seq,
						"rate", fmt.Sprintf("%.0f/s", float64(info.AckFloor.Stream-lastFloor)/time.Since(lastLog).Seconds()),
						"ack_pending", info.NumAckPending, "pending", info.NumPending)
				}
				lastLog, lastFloor = time.Now(), info.AckFloor.Stream
			}
			if info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream >= seq {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err != nil {
				return err
			}
			return fmt.Errorf("bench: consumer did not settle up to %d within %s (ack floor %d, pending %d, ack pending %d)",
				seq, timeout, info.AckFloor.Stream, info.NumPending, info.NumAckPending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(jsPollInterval):
		}
	}
}

// waitStored waits until the stream holds seq messages, or its last sequence has
// not moved for stallAfter (it returns the last sequence then).
func (p *jsProbe) waitStored(ctx context.Context, seq uint64, stallAfter time.Duration) (uint64, error) {
	var last uint64
	lastMove, lastLog := time.Now(), time.Now()
	for {
		cur, err := p.lastSeq(ctx)
		if err != nil {
			return last, err
		}
		if cur >= seq {
			return cur, nil
		}
		if cur != last {
			last, lastMove = cur, time.Now()
		} else if time.Since(lastMove) > stallAfter {
			return last, nil
		}
		if p.log != nil && time.Since(lastLog) >= p.logEvery {
			lastLog = time.Now()
			p.log.Info("bench: stream storing the captured commands", "stored", cur, "of", seq)
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-time.After(jsPollInterval):
		}
	}
}

// settleTimeout bounds the wait for n messages to be settled.
func settleTimeout(n int) time.Duration { return 60*time.Second + time.Duration(n)*5*time.Millisecond }

// jsPublish publishes n new commands with js.PublishAsync, at most publishWindow
// unacknowledged, and measures publishes acknowledged per second. The
// stream captures the command subjects and the intake answers them too: a publish
// is acknowledged by whichever comes first, the stream's PubAck or the ledger's
// reply (natsapi.WireReply). Then the consumer's confirmations are awaited.
func jsPublish(ctx context.Context, p *jsProbe, gens []*clientGen, n int) (res PhaseResult, err error) {
	res.Mode = fmt.Sprintf("js.PublishAsync, %d in flight", publishWindow)
	futures := make([]jetstream.PubAckFuture, 0, n)
	settled := 0 // futures[:settled] are resolved
	settle := func(f jetstream.PubAckFuture) error {
		select {
		case <-f.Ok():
			res.Commands++
			res.NewApplied++
			res.NewAnswered++
		case err := <-f.Err():
			res.Errors++
			if len(res.ErrorSamples) < 3 {
				res.ErrorSamples = append(res.ErrorSamples, err.Error())
			}
		case <-time.After(settleTimeout(publishWindow)):
			return fmt.Errorf("bench: a publish not acknowledged within %s", settleTimeout(publishWindow))
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		for len(futures)-settled >= publishWindow {
			if err := settle(futures[settled]); err != nil {
				return res, err
			}
			settled++
		}
		cmd := gens[i%len(gens)].next(0)
		f, err := p.js.PublishMsgAsync(&nats.Msg{Subject: natsapi.CommandSubject(string(cmd.typ)), Data: cmd.body})
		if err != nil {
			return res, fmt.Errorf("bench: publish: %w", err)
		}
		futures = append(futures, f)
	}
	for ; settled < len(futures); settled++ {
		if err := settle(futures[settled]); err != nil {
			return res, err
		}
	}
	elapsed := time.Since(start)
	res.Seconds = elapsed.Seconds()
	res.CommandsPerSec = float64(res.Commands) / elapsed.Seconds()
	return res, nil
}

// jsConsume publishes n new commands without a reply subject: only the stream
// takes them (the intake's request-reply path ignores a message nobody waits
// for), and the consumer decides each and acks it once durable. It measures the
// consumer's decisions per second, from its first ack to its last (the first
// delivery waits for the intake's grace, which is not the consumer's speed).
func jsConsume(ctx context.Context, p *jsProbe, gens []*clientGen, n int) (res PhaseResult, err error) {
	res.Mode = "jetstream consumer"
	before, err := p.lastSeq(ctx)
	if err != nil {
		return res, err
	}
	published := time.Now()
	for i := 0; i < n; i++ {
		cmd := gens[i%len(gens)].next(0)
		if err := p.nc.Publish(natsapi.CommandSubject(string(cmd.typ)), cmd.body); err != nil {
			return res, err
		}
	}
	if err := p.nc.FlushTimeout(30 * time.Second); err != nil {
		return res, err
	}
	target := before + uint64(n)
	// Wait until the stream holds them all (core publishes are not acknowledged).
	deadline := time.Now().Add(30 * time.Second)
	for {
		last, err := p.lastSeq(ctx)
		if err == nil && last >= target {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("bench: stream holds %d of %d published commands", last-before, n)
		}
		time.Sleep(jsPollInterval)
	}
	var (
		firstAt    time.Time
		firstFloor uint64
	)
	err = p.waitSettled(ctx, target, settleTimeout(n), func(floor uint64) {
		if firstAt.IsZero() && floor > before {
			firstAt, firstFloor = time.Now(), floor
		}
	})
	if err != nil {
		return res, err
	}
	end := time.Now()
	if firstAt.IsZero() || !end.After(firstAt) || firstFloor >= target {
		// The consumer had decided them all before the first look: count from the
		// first publish (a lower bound of its rate).
		firstAt, firstFloor = published, before
	}
	decided := float64(target - firstFloor)
	res.Commands = int64(n)
	res.NewApplied = int64(n)
	res.NewAnswered = int64(n)
	res.Seconds = end.Sub(firstAt).Seconds()
	res.CommandsPerSec = decided / res.Seconds
	return res, nil
}
