package natsapi

import (
	"strconv"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// encodeReply is the bytes of a command reply on the wire, json.Marshal(wire(r))
// byte for byte (field order, omitempty, escaping: compared in reply_test.go),
// written without reflection: every command and every duplicate pays for it.
func encodeReply(r reply.Reply) ([]byte, error) {
	w := wire(r)
	b := make([]byte, 0, 320+len(r.Message)+100*len(r.Events)+400*len(r.Replies))
	b = reply.AppendMembers(b, r)
	b = append(b, `,"stream":`...)
	b = domain.AppendJSONString(b, w.Stream)
	if e := w.Error; e != nil {
		b = append(b, `,"error":{"code":`...)
		b = strconv.AppendInt(b, int64(e.Code), 10)
		b = append(b, `,"description":`...)
		b = domain.AppendJSONString(b, e.Description)
		b = append(b, '}')
	}
	return append(b, '}'), nil
}
