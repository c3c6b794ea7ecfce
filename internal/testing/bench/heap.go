package bench

import (
	"math"
	"runtime"
	"strings"
)

// heapSplit is the live heap of this process by who allocated it.
type heapSplit struct{ ledger, nats, other int64 }

// The module's code that is the bench's, not the ledger's: its clients
// (internal/testing/...) and the Go client they use.
var benchPrefixes = []string{"github.com/ledgerworks/ledger/internal/testing/", "github.com/ledgerworks/ledger/client."}

const (
	modulePrefix     = "github.com/ledgerworks/ledger/"
	natsServerPrefix = "github.com/nats-io/nats-server/"
)

// liveHeapBySource collects, then splits the live heap by the allocation
// stacks of the heap profile (runtime.MemProfile, each record scaled as pprof
// scales a sample), as sourceOf names them.
func liveHeapBySource() heapSplit {
	runtime.GC() // publishes the profile of the cycle it completes
	n, _ := runtime.MemProfile(nil, false)
	var recs []runtime.MemProfileRecord
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		m, ok := runtime.MemProfile(recs, false)
		if ok {
			recs = recs[:m]
			break
		}
		n = m
	}
	var h heapSplit
	for i := range recs {
		b := scaledInUse(recs[i].InUseObjects(), recs[i].InUseBytes(), runtime.MemProfileRate)
		switch sourceOf(recs[i].Stack()) {
		case "ledger":
			h.ledger += b
		case "nats":
			h.nats += b
		default:
			h.other += b
		}
	}
	return h
}

// scaledInUse estimates the bytes a sampled record stands for, as pprof does
// (runtime/pprof's scaleHeapSample): a sample of average size s is taken with
// probability 1-exp(-s/rate).
func scaledInUse(count, size int64, rate int) int64 {
	if count == 0 || size == 0 {
		return 0
	}
	if rate <= 1 {
		return size
	}
	avg := float64(size) / float64(count)
	return int64(float64(size) / (1 - math.Exp(-avg/float64(rate))))
}

// sourceOf names who allocated along stack (leaf first): "ledger", "nats" or
// "other". A stack through the bench's own code (its clients, its seeding) is
// the bench's, whatever it calls; otherwise one through the module's code is
// the ledger's (every goroutine the ledger starts, and the process's entry,
// config.Main, which the main goroutine's stacks all pass).
func sourceOf(stack []uintptr) string {
	frames := runtime.CallersFrames(stack)
	module, nats := false, false
	for {
		f, more := frames.Next()
		for _, p := range benchPrefixes {
			if strings.HasPrefix(f.Function, p) {
				return "other"
			}
		}
		module = module || strings.HasPrefix(f.Function, modulePrefix)
		nats = nats || strings.HasPrefix(f.Function, natsServerPrefix)
		if !more {
			break
		}
	}
	switch {
	case module:
		return "ledger"
	case nats:
		return "nats"
	}
	return "other"
}
