// Package heaptest measures the heap for tests that bound what a structure
// keeps live.
package heaptest

import (
	"runtime"
	"runtime/metrics"
)

// Live is the heap live after a forced collection (runtime/metrics'
// /gc/heap/live:bytes): what is reachable, not what the collector let grow.
func Live() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
