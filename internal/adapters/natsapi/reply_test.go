package natsapi

import (
	"encoding/json"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/app/reply/replytest"
)

// TestEncodeReplyMatchesMarshal: the intake's reply encoder writes exactly what
// json.Marshal(wire(r)) writes, over many replies of every shape.
func TestEncodeReplyMatchesMarshal(t *testing.T) {
	replytest.MatchesMarshal(t, 9, 50000, encodeReply, func(r reply.Reply) ([]byte, error) { return json.Marshal(wire(r)) })
}
