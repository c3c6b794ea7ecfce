package domain

import (
	"fmt"
	"testing"
)

// TestInternerValueIsACopy: the interner's value equals the bytes it was
// given, for values that share its slots and values too long to keep, and
// stays so when those bytes change after (the page a decoder read is reused).
func TestInternerValueIsACopy(t *testing.T) {
	var in interner
	var got []string
	var want []string
	for i := range 3 * internSlots {
		v := fmt.Sprintf("command-%d", i%(2*internSlots))
		if i%7 == 0 {
			v += string(make([]byte, internLongest))
		}
		b := []byte(v)
		got = append(got, in.value(b))
		want = append(want, v)
		clear(b)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("value %d is %q, want %q", i, got[i], want[i])
		}
	}
}

// TestDecodeMetadataInternsItsCommonValues: decoding the metadata of an event
// the ledger writes allocates one string for each of its values but its
// command and producer, which repeat across events (interner): 3 objects for
// the first sample (its key, request hash and chain; its subject 1 more), 7
// before (TestMetadataFastAgrees says the values are encoding/json's).
func TestDecodeMetadataInternsItsCommonValues(t *testing.T) {
	b := metadataSamples(t)[0]
	if _, err := DecodeMetadataNoRequest(b); err != nil {
		t.Fatal(err)
	}
	n := testing.AllocsPerRun(100, func() {
		if _, err := DecodeMetadataNoRequest(b); err != nil {
			t.Fatal(err)
		}
	})
	if n > 4 {
		t.Fatalf("decoding %s allocates %v objects, more than its key, request hash, chain and subject", b, n)
	}
}

// TestInternerHoldsTheLedgersCommands: every command the ledger writes in its
// metadata, and a producer's name, find their copy in the interner once
// seen: none meets another in both of its slots.
func TestInternerHoldsTheLedgersCommands(t *testing.T) {
	var in interner
	values := [][]byte{[]byte("bench-history"), []byte("ledger-1")}
	for c := range commandFields {
		values = append(values, []byte(c))
	}
	for _, c := range []CommandType{CmdTransferDebit, CmdTransferCredit, CmdTransferCompensate, CmdExpireHold, CmdTransactionLeg, CmdCaptureCredit, CmdTransactionReserve, CmdCaptureGuard, CmdBatch} {
		values = append(values, []byte(c))
	}
	for _, v := range values {
		in.value(v)
	}
	n := testing.AllocsPerRun(10, func() {
		for _, v := range values {
			in.value(v)
		}
	})
	if n != 0 {
		t.Fatalf("the interner copies %v of the ledger's %d commands and producers again", n, len(values))
	}
}

// TestDecodeEventInternsRepeatedMembers: decoding a credit allocates its
// payload, its ref and its held_after, not its currency and reason
// (repeatedMembers): 3 objects, 5 before.
func TestDecodeEventInternsRepeatedMembers(t *testing.T) {
	b := []byte(`{"amount":392,"currency":"EUR","reason":"transfer_in","ref":"h-149","balance_after":449,"held_after":0}`)
	if _, err := DecodeEvent(EvCredited, b); err != nil {
		t.Fatal(err)
	}
	n := testing.AllocsPerRun(100, func() {
		if _, err := DecodeEvent(EvCredited, b); err != nil {
			t.Fatal(err)
		}
	})
	if n > 3 {
		t.Fatalf("decoding %s allocates %v objects, more than its payload, ref and held_after", b, n)
	}
}
