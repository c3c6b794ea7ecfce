// Package heaptest measures the heap for tests that bound what a structure
// keeps live.
package heaptest

import (
	"runtime"
	"runtime/metrics"
)

// Live is the heap live after a forced collection (runtime/metrics'
// /gc/heap/live:bytes): what is reachable, not what the collector let grow.
func Live() uint64 { return Now().Live }

// Heap is the heap after a forced collection: what is live, and of it what
// the collector must scan for pointers (runtime/metrics' /gc/scan/heap:bytes:
// an object's bytes up to its last pointer; a pointer-free one is not
// scanned), the collector's work for each mark of it; and the objects live
// (/gc/heap/objects:objects), each one the collector marks.
type Heap struct{ Live, Scannable, Objects uint64 }

// Now is the heap after a forced collection.
func Now() Heap {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/heap:bytes"}, {Name: "/gc/heap/objects:objects"}}
	metrics.Read(s)
	return Heap{Live: s[0].Value.Uint64(), Scannable: s[1].Value.Uint64(), Objects: s[2].Value.Uint64()}
}
