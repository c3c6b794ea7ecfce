package domain

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkDecodeBatch decodes a batch of 100 deposits shaped as the bench's
// batch phase sends them (client.Batch's elements: the type first, compacted).
func BenchmarkDecodeBatch(b *testing.B) {
	elems := make([]string, 100)
	for i := range elems {
		elems[i] = fmt.Sprintf(`{"type":"deposit","idempotency_key":"c17-%d","account_id":"acct-%04d","amount":%d,"currency":"EUR"}`, i, i*7%1000, 100+i)
	}
	body := []byte(`{"commands":[` + strings.Join(elems, ",") + `]}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ierr := DecodeBatch(body); ierr != nil {
			b.Fatal(ierr)
		}
	}
}
