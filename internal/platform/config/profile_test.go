package config

import (
	"compress/gzip"
	"encoding/binary"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// heapSink keeps the garbage churn allocates from being optimised away.
var heapSink []byte

// churn allocates garbage until the runtime has run cycles collections more.
func churn(t *testing.T, cycles uint64) {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	until := s[0].Value.Uint64() + cycles
	for i := 0; ; i++ {
		if metrics.Read(s); s[0].Value.Uint64() >= until {
			return
		}
		if i > 1_000_000 { // 1 TiB of garbage: the runtime collects long before
			t.Fatalf("no %d collections", cycles)
		}
		heapSink = make([]byte, 1<<20)
	}
}

// TestMemProfileAtLivePeak: --memprofile's profile is of the live heap's peak,
// not of the moment the heap in use (live and garbage) was highest. The run
// first churns garbage with little live up to a 192 MiB limit, then holds
// 48 MiB live (a heap in use well under that garbage's: the old sampler,
// keyed on the heap in use and 5% over its last sample, took no profile
// then, and the one it kept, taken without a collection, counted 98-203 MiB
// of that garbage in use), then lets it go and churns again. The profile
// written must hold the 48 MiB in use, and not much more.
//
// The test polls the sampler itself, between its own allocations (its ticker
// is an hour): a collection counts what is allocated while it marks as live
// (so does gctrace), and one forced while this test churned on a loaded
// machine read up to 491 MiB with 48 held (a review, 2026-11-29), which
// would make the test's figure depend on the machine's load, not on the
// sampler's choice.
func TestMemProfileAtLivePeak(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	const chunk, chunks = 4 << 20, 12 // chunks of 4 MiB: each sampled by the profiler (its rate 512 KiB)
	const held = chunk * chunks
	path := filepath.Join(t.TempDir(), "heap.pprof")
	h := startHeapPeak(path, time.Hour)

	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(192 << 20)
	churn(t, 10)
	h.poll(false) // the heap in use is high, the live heap not: a collection of the first reading only
	debug.SetMemoryLimit(math.MaxInt64)
	debug.SetGCPercent(100)

	live := make([][]byte, chunks)
	for i := range live {
		live[i] = make([]byte, chunk)
		live[i][0] = 1
	}
	devtest.Eventually(t, 2*time.Minute, "a profile taken with the 48 MiB live", func() bool {
		heapSink = make([]byte, 1<<20) // garbage, so that the runtime collects
		h.poll(false)
		return h.peakBytes() >= held
	})
	runtime.KeepAlive(live)
	live = nil
	churn(t, 5)
	h.poll(true) // a collection with the 48 MiB gone: its profile is not kept
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	inUse := profileInUse(t, path)
	t.Logf("profile: %.1f MiB in use, the peak's collection %.1f MiB live, %d MiB held", float64(inUse)/(1<<20), float64(h.peakBytes())/(1<<20), held>>20)
	if inUse < held*9/10 || inUse > held+32<<20 {
		t.Fatalf("the profile has %d bytes in use, want the %d held (at least 90%%, at most 32 MiB more)", inUse, held)
	}
}

// profileInUse is the sum of the inuse_space samples of the gzipped pprof
// profile at path (profile.proto: sample_type 1, sample 2, string_table 6).
func profileInUse(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	var types []int64     // each sample type's name, an index in strs
	var samples [][]int64 // each sample's values
	var strs []string
	protoFields(t, raw, func(field int, v uint64, b []byte) {
		switch field {
		case 1:
			protoFields(t, b, func(f int, v uint64, _ []byte) {
				if f == 1 {
					types = append(types, int64(v))
				}
			})
		case 2:
			var vals []int64
			protoFields(t, b, func(f int, v uint64, packed []byte) {
				if f == 2 && packed == nil {
					vals = append(vals, int64(v))
				}
				for f == 2 && len(packed) > 0 {
					x, n := binary.Uvarint(packed)
					vals, packed = append(vals, int64(x)), packed[n:]
				}
			})
			samples = append(samples, vals)
		case 6:
			strs = append(strs, string(b))
		}
	})
	for i, ty := range types {
		if strs[ty] == "inuse_space" {
			var sum int64
			for _, s := range samples {
				sum += s[i]
			}
			return sum
		}
	}
	t.Fatalf("no inuse_space among the profile's sample types %v", types)
	return 0
}

// protoFields calls each with the fields of the protobuf message b: a varint's
// value, or a length-delimited field's bytes (nil for a varint).
func protoFields(t *testing.T, b []byte, each func(field int, v uint64, data []byte)) {
	t.Helper()
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 {
			t.Fatal("profile: a bad field key")
		}
		b = b[n:]
		switch key & 7 {
		case 0:
			v, m := binary.Uvarint(b)
			if m <= 0 {
				t.Fatal("profile: a bad varint")
			}
			each(int(key>>3), v, nil)
			b = b[m:]
		case 2:
			l, m := binary.Uvarint(b)
			if m <= 0 || uint64(len(b)-m) < l {
				t.Fatal("profile: a bad length")
			}
			each(int(key>>3), 0, b[m:m+int(l)])
			b = b[m+int(l):]
		default:
			t.Fatalf("profile: wire type %d", key&7)
		}
	}
}
