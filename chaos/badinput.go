package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/ledgerworks/ledger/domain"
)

// badInputs is the table of malformed commands (the ledger service issue): each
// must be answered invalid_request and write nothing.
func badInputs() []struct{ name, typ, body string } {
	big := strings.Repeat("x", 70<<10)
	return []struct{ name, typ, body string }{
		{"float amount", "deposit", `{"idempotency_key":"s9-float","account_id":"s9-acc-00","amount":10.5,"currency":"EUR"}`},
		{"exponent amount", "deposit", `{"idempotency_key":"s9-exp","account_id":"s9-acc-00","amount":1e3,"currency":"EUR"}`},
		{"string amount", "deposit", `{"idempotency_key":"s9-str","account_id":"s9-acc-00","amount":"10","currency":"EUR"}`},
		{"negative amount", "deposit", `{"idempotency_key":"s9-neg","account_id":"s9-acc-00","amount":-5,"currency":"EUR"}`},
		{"zero amount", "deposit", `{"idempotency_key":"s9-zero","account_id":"s9-acc-00","amount":0,"currency":"EUR"}`},
		{"amount 2^53", "deposit", `{"idempotency_key":"s9-big","account_id":"s9-acc-00","amount":9007199254740992,"currency":"EUR"}`},
		{"unknown field", "deposit", `{"idempotency_key":"s9-unknown","account_id":"s9-acc-00","amount":5,"currency":"EUR","memo":"x"}`},
		{"lower-case currency", "deposit", `{"idempotency_key":"s9-cur","account_id":"s9-acc-00","amount":5,"currency":"eur"}`},
		{"bad account id", "deposit", `{"idempotency_key":"s9-id","account_id":"a b","amount":5,"currency":"EUR"}`},
		{"missing key", "deposit", `{"account_id":"s9-acc-00","amount":5,"currency":"EUR"}`},
		{"key too long", "deposit", `{"idempotency_key":"` + strings.Repeat("k", 129) + `","account_id":"s9-acc-00","amount":5,"currency":"EUR"}`},
		{"not JSON", "deposit", `{"idempotency_key":"s9-json",`},
		{"not an object", "deposit", `[1,2,3]`},
		{"body over 64 KiB", "deposit", `{"idempotency_key":"s9-large","account_id":"s9-acc-00","amount":5,"currency":"EUR","metadata":"` + big + `"}`},
		{"unknown command", "mint", `{"idempotency_key":"s9-mint","account_id":"s9-acc-00","amount":5,"currency":"EUR"}`},
		{"transfer to itself without id", "transfer", `{"idempotency_key":"s9-tr","from":"s9-acc-00","to":"s9-acc-01","amount":5,"currency":"EUR"}`},
		{"bad expires_at", "place_hold", `{"idempotency_key":"s9-hold","account_id":"s9-acc-00","hold_id":"h1","amount":5,"currency":"EUR","expires_at":"tomorrow"}`},
	}
}

func scenarioBadInput(ctx context.Context, s *suite, res *result) error {
	sys, c, err := upOne(ctx, s, "s9")
	if err != nil {
		return err
	}
	defer sys.down()
	h := c.h
	w := &workload{prefix: "s9", accounts: hotAccounts("s9", 2), producers: 1, commands: 20, retries: 8, seed: s.seed}
	if err := w.open(ctx, c); err != nil {
		return err
	}
	var wrong []string
	for _, bi := range badInputs() {
		key := keyOfBody(bi.body)
		a := c.send(ctx, key, bi.typ, []byte(bi.body))
		if a.Outcome != Failed || a.Reply.Code != domain.CodeInvalidRequest {
			code := ""
			if a.Reply != nil {
				code = string(a.Reply.Status) + "/" + string(a.Reply.Code)
			}
			wrong = append(wrong, fmt.Sprintf("%s: %s %s %s", bi.name, a.Outcome, code, a.Err))
		}
	}
	// The ledger still decides good commands afterwards.
	w.run(ctx, c)

	// The decoder, fuzzed (bounded by -fuzztime and a context).
	fctx, cancel := context.WithTimeout(ctx, s.fuzzTime+3*time.Minute)
	defer cancel()
	fuzz := exec.CommandContext(fctx, "go", "test", "-run", "^$", "-fuzz", "^FuzzDecodeCommand$", "-fuzztime", s.fuzzTime.String(), "./domain")
	out, ferr := fuzz.CombinedOutput()
	execs := ""
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "execs:") {
			execs = strings.TrimSpace(line)
		}
	}
	res.notes = append(res.notes, fmt.Sprintf("%d bad inputs sent, %d answered other than invalid_request; fuzz %s: %s", len(badInputs()), len(wrong), s.fuzzTime, execs))

	if err := sys.quiesce(ctx, 60*time.Second); err != nil {
		return err
	}
	if err := sys.finish(ctx, h, res, false, nil); err != nil {
		return err
	}
	for _, wr := range wrong {
		res.report.fail(3, "bad input not refused as invalid_request: %s", wr)
	}
	if ferr != nil {
		tail := string(out)
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		res.report.fail(5, "go test -fuzz FuzzDecodeCommand failed: %v\n%s", ferr, tail)
	}
	return nil
}

// keyOfBody is the key a malformed body names, or a placeholder for the history.
func keyOfBody(b string) string {
	const p = `"idempotency_key":"`
	i := strings.Index(b, p)
	if i < 0 {
		return "(no key)"
	}
	rest := b[i+len(p):]
	if j := strings.IndexByte(rest, '"'); j >= 0 {
		return rest[:j]
	}
	return "(no key)"
}
