package domain

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// plainStringByBytes is plainString read a byte at a time, as it was before
// plainBytes: what plainString must still do.
func plainStringByBytes(b []byte, i int) (content []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

func checkPlainString(t *testing.T, b []byte) {
	t.Helper()
	want, wantNext, wantOK := plainStringByBytes(b, 0)
	sc := flatScan{b: b}
	got, ok := sc.plainString()
	if ok != wantOK || ok && (!bytes.Equal(got, want) || sc.i != wantNext) {
		t.Fatalf("%q: %q, %v at %d; byte by byte %q, %v at %d", b, got, ok, sc.i, want, wantOK, wantNext)
	}
}

// TestPlainStringAgreesByteByByte: plainString (eight bytes at a time) reads
// what a byte-by-byte scan reads, and refuses what it refuses: every byte
// value at every place of strings up to 24 bytes long, then random strings
// of the bytes that matter (quotes, backslashes, control characters, high
// bytes).
func TestPlainStringAgreesByteByByte(t *testing.T) {
	refused := 0
	for n := range 25 {
		for at := range n {
			for c := range 256 {
				s := append([]byte{'"'}, bytes.Repeat([]byte{'a'}, n)...)
				s[1+at] = byte(c)
				s = append(s, '"', ',')
				checkPlainString(t, s)
				if _, ok := (&flatScan{b: s}).plainString(); !ok {
					refused++
				}
			}
		}
	}
	if want := 300 * 33; refused != want { // 300 places, 33 bytes refused at each (0x00-0x1f, '\\')
		t.Fatalf("%d refused, want %d", refused, want)
	}
	r := rand.New(rand.NewPCG(23, 1))
	alphabet := []byte("ab\"\\\x00\x1f\x20\x7f\x80\xffé")
	for range 100_000 {
		s := []byte{'"'}
		for range r.IntN(40) {
			s = append(s, alphabet[r.IntN(len(alphabet))])
		}
		checkPlainString(t, s)
	}
}

// BenchmarkPlainString: the strings of a realistic event's metadata (a key,
// a request hash, a chain, a time, a request's base64) read by plainString
// and byte by byte (plainStringByBytes), in one run:
//
//	go test ./domain -run '^$' -bench PlainString -benchmem
func BenchmarkPlainString(b *testing.B) {
	m := []byte(`{"key":"histirsjc-97176","command":"deposit","request_hash":"a88f364efae5f3574083926097d69b5ece99be4c3a3b7cf4b352a0e9c777223f","i":0,"n":1,"at":"2026-11-29T07:31:19.847936592Z","request":"eyJhY2NvdW50X2lkIjoiaGlzdGlyc2pjLWFjYy02MjE5NiIsImFtb3VudCI6MjQwLCJjdXJyZW5jeSI6IkVVUiIsInR5cGUiOiJkZXBvc2l0In0=","chain":"fc19447bf7177bcdb919e1d391098afd964a14115d12459fa2f482863376f4fc","schema":1,"producer":"bench-history"}`)
	var starts []int
	for i := 1; i < len(m); i++ {
		if m[i] == '"' && (m[i-1] == '{' || m[i-1] == ':' || m[i-1] == ',') {
			starts = append(starts, i)
		}
	}
	b.Run("words", func(b *testing.B) {
		for range b.N {
			for _, i := range starts {
				if sc := (flatScan{b: m, i: i}); !sc.plainStringOK() {
					b.Fatal(i)
				}
			}
		}
	})
	b.Run("bytes", func(b *testing.B) {
		for range b.N {
			for _, i := range starts {
				if _, _, ok := plainStringByBytes(m, i); !ok {
					b.Fatal(i)
				}
			}
		}
	})
}

func (sc *flatScan) plainStringOK() bool {
	_, ok := sc.plainString()
	return ok
}
