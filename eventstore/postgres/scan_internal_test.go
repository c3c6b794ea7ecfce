package postgres

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestEventBytesKeepsValuesApart: every value eventBytes copies reads back as
// it was after the values copied later and an append to each, empty and NULL
// values included.
func TestEventBytesKeepsValuesApart(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var b eventBytes
	var want, got [][]byte
	for i := range 2000 {
		v := bytes.Repeat([]byte{byte(i)}, r.IntN(3000))
		if i%97 == 0 {
			v = nil
		}
		want = append(want, bytes.Clone(v))
		c := b.copy(v)
		got = append(got, c)
		if (c == nil) != (v == nil) {
			t.Fatalf("value %d: nil %v, copied as nil %v", i, v == nil, c == nil)
		}
	}
	for _, c := range got {
		_ = append(c, 0xff) // must not write into the next value
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("value %d changed: %d bytes, want %d", i, len(got[i]), len(want[i]))
		}
	}
}

// TestDecimalAgreesWithParseUint: decimal reads what strconv.ParseUint reads,
// and leaves to it what it does not.
func TestDecimalAgreesWithParseUint(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	cases := []string{"", "0", "00", "01", "1", "-1", "+1", "1 ", "18446744073709551615", "18446744073709551616", "9999999999999999999", "99999999999999999999", "1_0", "x"}
	for range 10000 {
		cases = append(cases, strconv.FormatUint(r.Uint64()>>r.IntN(64), 10))
	}
	for _, s := range cases {
		n, ok := decimal([]byte(s))
		want, err := strconv.ParseUint(s, 10, 64)
		if ok && (err != nil || n != want) {
			t.Fatalf("%q: decimal %d; ParseUint %d, %v", s, n, want, err)
		}
		if !ok && err == nil && len(s) <= 19 && s[0] != '0' {
			t.Fatalf("%q: decimal left to ParseUint what it reads", s)
		}
	}
}

// TestEventBytesBlocksFollowTheValues: a read of a few small values takes one
// block of minBlockBytes; the blocks then double up to maxBlockBytes, never
// sized by what the read asked for.
func TestEventBytesBlocksFollowTheValues(t *testing.T) {
	var b eventBytes
	b.copy(make([]byte, 100))
	b.copy(make([]byte, 100))
	if cap(b.block) != minBlockBytes {
		t.Fatalf("two values of 100 bytes: a block of %d bytes, want %d", cap(b.block), minBlockBytes)
	}
	last := cap(b.block)
	for range 10000 {
		b.copy(make([]byte, 300))
		if c := cap(b.block); c != last {
			if c != min(2*last, maxBlockBytes) {
				t.Fatalf("a block of %d bytes after one of %d, want %d", c, last, min(2*last, maxBlockBytes))
			}
			last = c
		}
	}
	if last != maxBlockBytes {
		t.Fatalf("3 MB of values: the last block %d bytes, want %d", last, maxBlockBytes)
	}
}
