package client

import "testing"

// A JetStream publish acknowledgement (or its error) is told from a ledger
// reply, which always has a code.
func TestParseStoredAck(t *testing.T) {
	for _, c := range []struct {
		in    string
		isAck bool
		seq   uint64
	}{
		{`{"stream":"LEDGER_COMMANDS","seq":3}`, true, 3},
		{`{"stream":"LEDGER_COMMANDS","seq":4,"duplicate":true}`, true, 4},
		{`{"error":{"code":503,"description":"x"}}`, true, 0},
		{`{"status":"applied","code":"ok","duplicate":false,"stream":"LEDGER_COMMANDS"}`, false, 0},
		{`{"code":"not_found"}`, false, 0},
		{`{"status":"applied","code":"ok","stream":"LEDGER_COMMANDS","seq":5}`, false, 0},
		{`{ "status":"applied","code":"ok","stream":"LEDGER_COMMANDS","seq":5}`, false, 0},
		{`not json`, false, 0},
	} {
		a, isAck := parseStoredAck([]byte(c.in))
		if isAck != c.isAck || (a != nil) != (c.seq > 0) || (a != nil && a.Seq != c.seq) {
			t.Errorf("parseStoredAck(%s) = %+v, %v; want an ack %v with seq %d", c.in, a, isAck, c.isAck, c.seq)
		}
	}
}
