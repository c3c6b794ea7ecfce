package domain

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"testing"
	"time"
)

func randomTime(rng *rand.Rand) time.Time {
	var t time.Time
	switch rng.Intn(6) {
	case 0: // zero
	case 1: // years outside [0,9999]: json.Marshal refuses them
		t = time.Date(10000+rng.Intn(100), 1, 1, 0, 0, 0, 0, time.UTC)
		if rng.Intn(2) == 0 {
			t = time.Date(-1-rng.Intn(100), 1, 1, 0, 0, 0, 0, time.UTC)
		}
	default:
		t = time.Unix(rng.Int63n(5e9), rng.Int63n(1e9)*int64(rng.Intn(2)))
	}
	zones := []*time.Location{time.UTC, time.FixedZone("p", 5*3600+1800), time.FixedZone("n", -7*3600), time.FixedZone("s", 3600+17), time.FixedZone("big", 25*3600)}
	return t.In(zones[rng.Intn(len(zones))])
}

func sameEncoding(t *testing.T, what string, v any, got []byte, gotErr error) {
	t.Helper()
	want, wantErr := json.Marshal(v)
	if (gotErr != nil) != (wantErr != nil) || !bytes.Equal(got, want) {
		t.Fatalf("%s %+v:\n got %s (%v)\nwant %s (%v)", what, v, got, gotErr, want, wantErr)
	}
}

func TestEncodeMetadataMatchesMarshal(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	maybe := func() string {
		if rng.Intn(3) == 0 {
			return ""
		}
		return randomJSONString(rng)
	}
	for range 20000 {
		m := Metadata{Key: maybe(), Command: maybe(), RequestHash: maybe(), Index: rng.Intn(5) - 1, Count: rng.Int() - rng.Int(),
			At: randomTime(rng), Origin: maybe(), Chain: maybe(), Schema: rng.Intn(3) - 1, Producer: maybe(), Claimed: rng.Intn(2) == 0, Subject: maybe()}
		if rng.Intn(2) == 0 {
			e := randomTime(rng)
			m.EffectiveAt = &e
		}
		switch rng.Intn(3) {
		case 0:
			m.Request = []byte{}
		case 1:
			m.Request = []byte(randomJSONString(rng) + randomJSONString(rng))
		}
		got, err := EncodeMetadata(m)
		sameEncoding(t, "metadata", m, got, err)
	}
}

func TestEncodeKeyClaimedMatchesMarshal(t *testing.T) {
	rng := rand.New(rand.NewSource(13))
	for _, p := range pinnedCommands {
		c := p.cmd.Canonical()
		key, stream := randomJSONString(rng), randomJSONString(rng)
		rev := rng.Uint64() >> uint(rng.Intn(64))
		got := EncodeKeyClaimed(key, string(p.cmd.Type), c, stream, rev)
		v := KeyClaimed{Key: key, Command: string(p.cmd.Type), RequestHash: c.Hash, Request: c.JSON, Stream: stream, Revision: &rev}
		sameEncoding(t, "key claim", v, got, nil)
		if r, err := c.Request(); err != nil {
			t.Fatal(err)
		} else if rc := r.Canonical(); !bytes.Equal(EncodeKeyClaimed(key, "x", rc, stream, rev), mustMarshal(t, KeyClaimed{Key: key, Command: "x", RequestHash: rc.Hash, Request: rc.JSON, Stream: stream, Revision: &rev})) {
			t.Fatalf("key claim of a parsed request differs")
		}
	}
	for range 5000 {
		c := Command{Type: CmdOpenAccount, AccountID: randomJSONString(rng), Currency: randomJSONString(rng), Metadata: map[string]string{randomJSONString(rng): randomJSONString(rng)}}.Canonical()
		key, stream := randomJSONString(rng), randomJSONString(rng)
		var rev uint64
		sameEncoding(t, "key claim", KeyClaimed{Key: key, Command: "open_account", RequestHash: c.Hash, Request: c.JSON, Stream: stream, Revision: &rev}, EncodeKeyClaimed(key, "open_account", c, stream, rev), nil)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// go test ./domain -run '^$' -bench 'HotEncode' -benchmem
func BenchmarkHotEncode(b *testing.B) {
	req := pinnedCommands[0].cmd.Canonical()
	m := Metadata{Key: "k-123456", Command: "deposit", RequestHash: req.Hash, Count: 1, At: time.Date(2026, 11, 22, 18, 0, 0, 123456789, time.UTC),
		Request: req.JSON, Chain: req.Hash, Schema: 1, Producer: "ledger-1"}
	ways := []struct {
		name string
		enc  func() ([]byte, error)
	}{
		{"metadata/marshal", func() ([]byte, error) { return json.Marshal(m) }},
		{"metadata/direct", func() ([]byte, error) { return EncodeMetadata(m) }},
		{"keyclaim/marshal", func() ([]byte, error) {
			rev := uint64(123456)
			return json.Marshal(KeyClaimed{Key: m.Key, Command: m.Command, RequestHash: req.Hash, Request: req.JSON, Stream: "account-acc-42", Revision: &rev})
		}},
		{"keyclaim/direct", func() ([]byte, error) { return EncodeKeyClaimed(m.Key, m.Command, req, "account-acc-42", 123456), nil }},
	}
	for _, w := range ways {
		b.Run(w.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := w.enc(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
