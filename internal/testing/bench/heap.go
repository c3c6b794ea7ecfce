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
// scales a sample): an allocation whose outermost frame of this module is the
// bench's (its clients) counts as other, one of the module's own code as the
// ledger's (service, store, domain, intake, node), one without a frame of the
// module but with one of nats-server as NATS's, and the rest as other (the
// NATS clients' buffers, the runtime).
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
// "other".
func sourceOf(stack []uintptr) string {
	frames := runtime.CallersFrames(stack)
	outer, nats := "", false
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, modulePrefix) {
			outer = f.Function
		} else if strings.HasPrefix(f.Function, natsServerPrefix) {
			nats = true
		}
		if !more {
			break
		}
	}
	switch {
	case outer != "":
		for _, p := range benchPrefixes {
			if strings.HasPrefix(outer, p) {
				return "other"
			}
		}
		return "ledger"
	case nats:
		return "nats"
	}
	return "other"
}
