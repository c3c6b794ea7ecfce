package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

type crashCmd struct {
	typ     string
	key     string
	account string
	amount  int64 // signed effect on the balance
	body    []byte
}

// sendOnce sends c through the ledger's Go client on nc, which resends it
// (same key) while its answer is not definite, bounded by timeout: definite or
// not.
func sendOnce(nc *nats.Conn, c crashCmd, timeout time.Duration) (reply.Reply, bool) {
	lc := client.New(nc, client.WithoutBatching())
	defer lc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := devtest.Send(ctx, lc, devtest.Command{Type: c.typ, Body: c.body, Key: c.key})
	return r, err == nil
}

// Crash safety: `ledger dev` is SIGKILLed three times at random moments while eight
// clients post 1,000 commands (20% of them resends of the same key), restarted on
// the same data dir each time; afterwards every key without a definite reply is
// retried with the same key until it gets one. Every key is applied exactly once
// and the balances are those a model of the commands predicts.
func TestCrashSafetyUnderSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test")
	}
	ledgerBinary(t)
	started := time.Now()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 7))
	dir := t.TempDir()
	stopClusterOnCleanup(t, dir)
	natsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args := []string{"--nats-addr", natsAddr, "--jetstream-grace", "500ms", "--shutdown-timeout", "20s"}
	dev := startDev(t, dir, args, nil)
	t.Logf("first start after %s", time.Since(started))

	nc := devtest.ConnectURL(t, "nats://"+natsAddr, nats.ReconnectWait(50*time.Millisecond))

	// Accounts, opened and funded before the storm.
	const accounts = 16
	const seedAmount = 1_000_000_000
	balance := map[string]int64{}
	var setup []crashCmd
	for i := range accounts {
		id := fmt.Sprintf("acc-%02d", i)
		setup = append(setup,
			mkCrashCmd("open_account", "open-"+id, id, 0, map[string]any{"currency": "EUR"}),
			mkCrashCmd("deposit", "seed-"+id, id, seedAmount, map[string]any{"amount": seedAmount, "currency": "EUR"}))
		balance[id] = seedAmount
	}
	for _, c := range setup {
		if r, ok := sendOnce(nc, c, 20*time.Second); !ok || r.Status != domain.StatusApplied {
			t.Fatalf("%s: %+v", c.key, r)
		}
	}

	// 800 distinct commands and 200 resends of them, shuffled.
	var unique []crashCmd
	for i := range 800 {
		id := fmt.Sprintf("acc-%02d", rnd.IntN(accounts))
		amount := int64(1 + rnd.IntN(1000))
		if rnd.IntN(10) < 6 {
			unique = append(unique, mkCrashCmd("deposit", fmt.Sprintf("dep-%d", i), id, amount, map[string]any{"amount": amount, "currency": "EUR"}))
			balance[id] += amount
		} else {
			unique = append(unique, mkCrashCmd("withdraw", fmt.Sprintf("wd-%d", i), id, -amount, map[string]any{"amount": amount, "currency": "EUR"}))
			balance[id] -= amount
		}
	}
	sends := append([]crashCmd(nil), unique...)
	for range 200 {
		sends = append(sends, unique[rnd.IntN(len(unique))])
	}
	rnd.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })

	// Three kills at random points of the stream of sends.
	var killAt []int64
	var jitter []time.Duration
	for _, f := range []float64{0.15, 0.45, 0.75} {
		killAt = append(killAt, int64((f+rnd.Float64()*0.2)*float64(len(sends))))
		jitter = append(jitter, time.Duration(rnd.IntN(20))*time.Millisecond)
	}
	var progress atomic.Int64
	var mu sync.Mutex
	definite := map[string]reply.Reply{}
	var indefinite atomic.Int64

	work := make(chan crashCmd)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				r, ok := sendOnce(nc, c, 2*time.Second)
				progress.Add(1)
				if !ok {
					indefinite.Add(1)
					continue
				}
				mu.Lock()
				if _, seen := definite[c.key]; !seen || !r.Duplicate {
					definite[c.key] = r
				}
				mu.Unlock()
			}
		}()
	}
	killerDone := make(chan struct{})
	var restarts []time.Duration
	go func() {
		defer close(killerDone)
		for i, at := range killAt {
			for progress.Load() < at {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(jitter[i])
			dev.kill()
			t0 := time.Now()
			next, err := launchDev(t, dir, args, nil)
			if err != nil {
				t.Errorf("restart: %v", err)
				dev = nil
				return
			}
			dev = next
			restarts = append(restarts, time.Since(t0))
		}
	}()
	for _, c := range sends {
		work <- c
		time.Sleep(time.Duration(rnd.IntN(3)) * time.Millisecond)
	}
	close(work)
	wg.Wait()
	<-killerDone
	if dev == nil {
		t.Fatal("ledger dev did not come back after a kill")
	}
	t.Logf("storm done after %s: %d sends without a definite reply; restarts took %v", time.Since(started), indefinite.Load(), restarts)

	// Retry every key that got no definite reply, with the same key and body.
	retried := 0
	for _, c := range unique {
		mu.Lock()
		_, ok := definite[c.key]
		mu.Unlock()
		if ok {
			continue
		}
		retried++
		r, ok := sendOnce(nc, c, time.Minute)
		if !ok {
			t.Fatalf("%s: no definite reply within a minute of resends", c.key)
		}
		definite[c.key] = r
	}
	t.Logf("retried %d keys", retried)
	for _, c := range unique {
		if r := definite[c.key]; r.Status != domain.StatusApplied {
			t.Errorf("%s: %+v", c.key, r)
		}
	}

	// The event store: every key applied exactly once, balances as the model says.
	store := devtest.Store(t, dev.info.EventStoreURL)
	projtest.AuditOK(t, store, nil) // among the invariants: every key decided once, every event ID unique
	perKey := map[string]int{}
	streamOf := map[string]string{}
	for _, ev := range devtest.ReadAll(t, store) {
		if !strings.HasPrefix(ev.Stream, domain.AccountStreamPrefix) {
			continue
		}
		m, err := domain.DecodeMetadata(ev.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		perKey[m.Key]++
		streamOf[m.Key] = ev.Stream
	}
	for _, c := range append(setup, unique...) {
		if n := perKey[c.key]; n != 1 {
			t.Errorf("%s applied %d times", c.key, n)
		}
		if s := streamOf[c.key]; s != domain.AccountStream(c.account) {
			t.Errorf("%s written to %q", c.key, s)
		}
	}
	if len(perKey) != len(setup)+len(unique) {
		t.Errorf("%d keys in the account streams, %d commands sent", len(perKey), len(setup)+len(unique))
	}
	for id, want := range balance {
		if acc := devtest.Account(t, store, id); acc.Balance != want {
			t.Errorf("%s: balance %d, model %d", id, acc.Balance, want)
		}
	}
	dev.stop()
	t.Logf("done after %s", time.Since(started))
}

func mkCrashCmd(typ, key, account string, effect int64, fields map[string]any) crashCmd {
	body := map[string]any{"idempotency_key": key, "account_id": account}
	for k, v := range fields {
		body[k] = v
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return crashCmd{typ: typ, key: key, account: account, amount: effect, body: b}
}
