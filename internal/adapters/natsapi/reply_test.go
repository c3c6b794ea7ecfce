package natsapi

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/reply/replytest"
)

// TestEncodeReplyMatchesMarshal: the intake's reply encoder writes exactly what
// json.Marshal(wire(r)) writes, over many replies of every shape.
func TestEncodeReplyMatchesMarshal(t *testing.T) {
	rng := rand.New(rand.NewSource(9))
	for i := range 50000 {
		r := replytest.Reply(rng)
		if i%4 == 0 {
			r = replytest.BatchReply(rng)
		}
		got, err := encodeReply(r)
		want, werr := json.Marshal(wire(r))
		if err != nil || werr != nil || !bytes.Equal(got, want) {
			t.Fatalf("reply %d %+v:\n got %s (%v)\nwant %s (%v)", i, r, got, err, want, werr)
		}
	}
}
