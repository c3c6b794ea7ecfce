package domain

import "math"

// MaxAmount is the largest amount a command may carry: 2^53-1 minor units, so that
// every JSON client can carry it exactly.
const MaxAmount int64 = 1<<53 - 1

// addMinor returns a+b, or ok=false when the sum leaves the int64 range.
func addMinor(a, b int64) (sum int64, ok bool) {
	if (b > 0 && a > math.MaxInt64-b) || (b < 0 && a < math.MinInt64-b) {
		return 0, false
	}
	return a + b, true
}

// subMinor returns a-b, or ok=false when the difference leaves the int64 range.
func subMinor(a, b int64) (diff int64, ok bool) {
	if (b > 0 && a < math.MinInt64+b) || (b < 0 && a > math.MaxInt64+b) {
		return 0, false
	}
	return a - b, true
}
