package devtest

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Failure runs check with a testing.TB of its own and returns the first
// failure check reported (an Error or a Fatal), failing t when check passed:
// it shows that a checker catches a broken input. A Fatal or FailNow ends
// check, as it ends a test; everything else (Logf, Cleanup, TempDir...) is t's.
func Failure(t *testing.T, check func(tb testing.TB)) string {
	t.Helper()
	r := &failures{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.failed {
		t.Fatal("the check passed")
	}
	return r.first
}

// failures is the testing.TB of Failure: it keeps the failures.
type failures struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	first  string
}

func (f *failures) fail(msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failed {
		f.failed, f.first = true, msg
	}
}

func (f *failures) Helper() {}

func (f *failures) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

func (f *failures) Fail() { f.fail("failed") }

func (f *failures) FailNow() {
	f.Fail()
	runtime.Goexit()
}

func (f *failures) Error(args ...any) { f.fail(strings.TrimSuffix(fmt.Sprintln(args...), "\n")) }

func (f *failures) Errorf(format string, args ...any) { f.fail(fmt.Sprintf(format, args...)) }

func (f *failures) Fatal(args ...any) {
	f.Error(args...)
	runtime.Goexit()
}

func (f *failures) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}
