package ledger

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// The one crash-at-every-step harness of the saga tests (transfers, their
// refunds, transactions, captures): a command crashed at each failpoint step of
// each path it may take, then recovered by the transfer process of another
// instance or by the client's retry, and answered the same ever after.

// errCrash is what a failpoint returns to abort a handler between two steps.
var errCrash = errors.New("test: crash")

// crashAt makes s abort at the named step, every time it gets there.
func crashAt(s *Service, step string) {
	s.failpoint = func(got string) error {
		if got == step {
			return errCrash
		}
		return nil
	}
}

// How a crashed command is finished.
const (
	byProcess = "process" // the transfer process of another instance, past the grace period
	byRetry   = "retry"   // the client's retry with the same key
)

// byEither recovers every crash both ways.
var byEither = []string{byProcess, byRetry}

// crashPath is one path a command may take: its name and the failpoint steps
// along it. A test's paths embed it beside what they expect.
type crashPath struct {
	name  string
	steps []string
}

func (p crashPath) path() crashPath { return p }

// crashRig crashes and recovers commands on one store, with services that
// newService makes (each call another instance).
type crashRig struct {
	t          *testing.T
	st         ProcessStore
	clk        *devtest.Clock
	newService func(Store, *devtest.Clock) *Service
	runs       int
}

// everyStep calls run once for each step of each path and each way of
// recovery in by, with an ID unique in the rig's test: "<path>-<by>-<n>".
func everyStep[P interface{ path() crashPath }](rig *crashRig, paths []P, by []string, run func(p P, step, by, id string)) {
	for _, p := range paths {
		for _, step := range p.path().steps {
			for _, b := range by {
				rig.runs++
				run(p, step, b, fmt.Sprintf("%s-%s-%d", p.path().name, b, rig.runs))
			}
		}
	}
}

// crashThenRecover sends command typ (body: its fields, the key among them) to
// a service that crashes at step, calls halfway, then recovers it by the
// transfer process (byProcess) or by the client's retry (byRetry, a duplicate
// since the request was written before the crash); a later send to another
// instance must answer the same reply as a duplicate. It returns the
// recovered reply.
func (rig *crashRig) crashThenRecover(typ string, body []any, step, by string, halfway func()) Reply {
	t := rig.t
	t.Helper()
	var key string
	for i := 0; i+1 < len(body); i += 2 {
		if body[i] == "idempotency_key" {
			key = body[i+1].(string)
		}
	}
	crashing := rig.newService(rig.st, rig.clk)
	crashAt(crashing, step)
	if r := send(crashing, typ, body...); r.Status != domain.StatusError {
		t.Fatalf("%s at %s: no crash: %+v", key, step, r)
	}
	halfway()
	r := rig.recover(crashing, key, typ, body, by)
	if dup := send(rig.newService(rig.st, rig.clk), typ, body...); !dup.Duplicate || !sameReply(dup, r) {
		t.Fatalf("%s crashed at %s, recovered by %s: a later duplicate differs:\n%+v\n%+v", key, step, by, dup, r)
	}
	return r
}

// recover finishes the command that crashing crashed, by the process or the
// retry, and returns its reply.
func (rig *crashRig) recover(crashing *Service, key, typ string, body []any, by string) Reply {
	t := rig.t
	t.Helper()
	if by == byProcess {
		rig.clk.Advance(time.Minute) // past the grace period
		// A pass reads "all" up to the store's gap-safe horizon, which any
		// write transaction still open on the cluster holds back (a snapshot
		// written in the background, say): one pass may end before the
		// crashed command's events are visible. Passes run until it is
		// decided, as Run's would, a bounded number of times.
		const passes = 50
		for pass := 1; ; pass++ {
			recoverPass(t, NewProcess(rig.newService(rig.st, rig.clk), rig.st, ProcessOptions{Grace: time.Second}))
			r, err := crashing.Lookup(context.Background(), key)
			if err != nil || (r == nil && pass == passes) {
				t.Fatalf("%s: lookup after %d recovery passes: %v %v", key, pass, r, err)
			}
			if r != nil {
				return *r
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	crashing.failpoint = nil
	r := send(crashing, typ, body...)
	if !r.Duplicate {
		t.Fatalf("%s: retry not a duplicate: %+v", key, r)
	}
	return r
}
