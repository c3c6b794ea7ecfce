package domain

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/rand"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// chainHashStreaming is ChainHash as first written (a streaming hash.Hash): the
// buffered ChainHash must give the same bytes, which every stored chain holds.
func chainHashStreaming(prev string, ev StoredEvent) string {
	h := sha256.New()
	field := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	var rev [8]byte
	binary.BigEndian.PutUint64(rev[:], ev.Revision)
	field([]byte(prev))
	field(ev.ID[:])
	field([]byte(ev.Stream))
	field(rev[:])
	field([]byte(ev.Type))
	field(ev.Data)
	field([]byte(ev.Metadata.Key))
	field([]byte(ev.Metadata.RequestHash))
	return hex.EncodeToString(h.Sum(nil))
}

func TestEventIDAndChainHashMatchReference(t *testing.T) {
	// Pinned before the stack-buffer versions.
	if got := EventID("k-1", "account-a", 0).String(); got != uuid.NewSHA1(Namespace, []byte("k-1/account-a/0")).String() {
		t.Fatalf("EventID = %s", got)
	}
	rng := rand.New(rand.NewSource(3))
	str := func() string { return strings.Repeat(randomJSONString(rng), rng.Intn(60)) }
	for range 5000 {
		key, stream, i := str(), str(), rng.Intn(1<<20)
		if rng.Intn(10) == 0 {
			i = rng.Int()
		}
		want := uuid.NewSHA1(Namespace, []byte(key+"/"+stream+"/"+strconv.Itoa(i)))
		if got := EventID(key, stream, i); got != want {
			t.Fatalf("EventID(%q, %q, %d) = %s, want %s", key, stream, i, got, want)
		}
		ev := StoredEvent{ID: want, Stream: stream, Revision: rng.Uint64(), Type: str(), Data: []byte(str() + str()), Metadata: Metadata{Key: key, RequestHash: str()}}
		prev := str()
		if got, want := ChainHash(prev, ev), chainHashStreaming(prev, ev); got != want {
			t.Fatalf("ChainHash = %s, want %s", got, want)
		}
	}
}

// go test ./domain -run '^$' -bench 'HotIDChain' -benchmem
func BenchmarkHotIDChain(b *testing.B) {
	ev := StoredEvent{Stream: "account-acc-42", Revision: 17, Type: EvCredited, Data: []byte(`{"amount":1250,"currency":"EUR","reason":"deposit","balance_after":5000}`), Metadata: Metadata{Key: "k-123456", RequestHash: "4ddb418eda5b6bf005dd45fcb0586a44a98db9b9e649b17b1d2f0d80afe21d8f"}}
	b.Run("reference", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ev.ID = uuid.NewSHA1(Namespace, []byte(ev.Metadata.Key+"/"+ev.Stream+"/0"))
			_ = chainHashStreaming("prev", ev)
		}
	})
	b.Run("buffered", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ev.ID = EventID(ev.Metadata.Key, ev.Stream, 0)
			_ = ChainHash("prev", ev)
		}
	})
}
