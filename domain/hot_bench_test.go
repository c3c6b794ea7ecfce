package domain

import "testing"

// go test ./domain -run '^$' -bench 'Hot' -benchmem -count 5
var hotBodies = map[CommandType][]byte{
	CmdDeposit:     []byte(`{"idempotency_key":"k-123456","account_id":"acc-42","amount":1250,"currency":"EUR"}`),
	CmdOpenAccount: []byte(`{"idempotency_key":"k-open-1","account_id":"acc-42","currency":"EUR","overdraft_limit":500,"metadata":{"owner":"alice","tier":"gold"}}`),
	CmdTransfer:    []byte(`{"idempotency_key":"k-t-1","transfer_id":"t-1","from":"acc-1","to":"acc-2","amount":300,"currency":"EUR"}`),
}

func BenchmarkHotDecodeCommand(b *testing.B) {
	for _, t := range []CommandType{CmdDeposit, CmdOpenAccount, CmdTransfer} {
		b.Run(string(t), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeCommand(t, hotBodies[t]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHotRequestHash: the request hash through the map and json.Marshal
// (Request().Hash()) and through Canonical.
func BenchmarkHotRequestHash(b *testing.B) {
	for _, t := range []CommandType{CmdDeposit, CmdOpenAccount} {
		cmd, err := DecodeCommand(t, hotBodies[t])
		if err != nil {
			b.Fatal(err)
		}
		ways := []struct {
			name string
			hash func() string
		}{{"map", func() string { return cmd.Request().Hash() }}, {"canonical", func() string { return cmd.Canonical().Hash }}}
		for _, w := range ways {
			b.Run(string(t)+"/"+w.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_ = w.hash()
				}
			})
		}
	}
}
