package devtest

import (
	"context"
	"testing"
	"time"
)

// Running is a runner that Go started in the background: a transfer process,
// a projector, an events publisher.
type Running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Go runs run in a goroutine until Stop, or until t ends (an error run returns
// then fails t).
func Go(t testing.TB, run func(ctx context.Context) error) *Running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx)
	}()
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// Stop cancels the runner's context, waits for run to return and returns its
// error; again, it returns the same.
func (r *Running) Stop() error {
	r.cancel()
	<-r.done
	return r.err
}

// Stepper is a runner stepped by hand: a projector (projections.Runner) or an
// events publisher (projections.Publisher); Step reports what it did.
type Stepper interface {
	Step(ctx context.Context) (int, error)
}

// CatchUp steps s until a step finds nothing to do, within a minute; a
// step's error fails t.
func CatchUp(t testing.TB, s Stepper) {
	t.Helper()
	CatchUpRetrying(t, s, nil)
}

// CatchUpRetrying is CatchUp stepping again, after a pause, after an error
// that retry (when not nil) admits.
func CatchUpRetrying(t testing.TB, s Stepper, retry func(error) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		n, err := s.Step(ctx)
		if err != nil {
			if retry == nil || ctx.Err() != nil || !retry(err) {
				t.Fatalf("step: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if n == 0 {
			return
		}
	}
}
