package domain

import (
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkFastDecode: whatever DecodeCommand's fast path accepts, the strict general
// decoder accepts too, with the same Command.
func checkFastDecode(t *testing.T, typ CommandType, body []byte) (fastTook bool) {
	t.Helper()
	specs, ok := commandFields[typ]
	if !ok || len(body) > MaxBodyBytes || !utf8.Valid(body) {
		return false // refused before either path runs
	}
	fast, ok := decodeFast(typ, specs, body)
	if !ok {
		return false
	}
	general, err := decodeGeneral(typ, specs, body)
	if err != nil {
		t.Fatalf("%s %q: the fast path accepted what the general one refuses: %v", typ, body, err)
	}
	if !reflect.DeepEqual(fast, general) {
		t.Fatalf("%s %q:\nfast    %+v\ngeneral %+v", typ, body, fast, general)
	}
	return true
}

// TestDecodeFastAgreesWithGeneral runs the comparison over the fuzz corpus and
// over mutations of well-formed bodies (spacing, order, duplicates, unknown names,
// escapes, nulls, numbers of every shape, limits), and requires the fast path to
// take the plain well-formed bodies.
func TestDecodeFastAgreesWithGeneral(t *testing.T) {
	files, _ := filepath.Glob("testdata/fuzz/FuzzDecodeCommand/*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var args []string
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if line = strings.TrimSpace(line); line == "" {
				continue
			}
			line = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(line, "string("), "[]byte("), ")")
			v, err := strconv.Unquote(line)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			args = append(args, v)
		}
		if len(args) == 2 {
			checkFastDecode(t, CommandType(args[0]), []byte(args[1]))
		}
	}
	plain := map[CommandType]string{
		CmdDeposit:      `{"idempotency_key":"k-1","account_id":"a","amount":5,"currency":"EUR"}`,
		CmdWithdraw:     `{"idempotency_key":"k-1","account_id":"a","amount":5,"currency":"EUR"}`,
		CmdOpenAccount:  `{"idempotency_key":"k-1","account_id":"a","currency":"EUR","overdraft_limit":0}`,
		CmdTransfer:     `{"idempotency_key":"k <1>","transfer_id":"t","from":"a","to":"b","amount":1000000,"currency":"EUR"}`,
		CmdPlaceHold:    `{"idempotency_key":"k","account_id":"a","hold_id":"h","amount":1,"currency":"EUR","expires_at":"2030-01-01T00:00:00.5+02:00"}`,
		CmdCaptureHold:  `{"idempotency_key":"k","account_id":"a","hold_id":"h"}`,
		CmdReleaseHold:  `{"idempotency_key":"k","account_id":"a","hold_id":"h"}`,
		CmdRefund:       `{"idempotency_key":"k","original_key":"o k","amount":3}`,
		CmdCloseAccount: ` { "idempotency_key" : "k" ,` + "\n\t" + `"account_id":"a" } ` + "\r\n",
	}
	for typ, body := range plain {
		if _, ok := decodeFast(typ, commandFields[typ], []byte(body)); !ok {
			t.Errorf("%s: the fast path did not take %s", typ, body)
		}
		checkFastDecode(t, typ, []byte(body))
	}
	values := []string{`"a"`, `"EUR"`, `"eur"`, `""`, `"a\"b"`, `"\u0041"`, `"é"`, `"` + strings.Repeat("x", 300) + `"`, `"2030-01-01T00:00:00Z"`, `"2030-13-01T00:00:00Z"`,
		`0`, `-0`, `1`, `-1`, `01`, `1.0`, `1e3`, `1E3`, `-`, `--1`, `9223372036854775807`, `9223372036854775808`, `100000000000000000`, `null`, `true`, `{}`, `{"a":"b"}`, `[]`, `"\t"`, "\"\x01\""}
	names := []string{"idempotency_key", "account_id", "amount", "currency", "transfer_id", "from", "to", "hold_id", "expires_at", "original_key", "overdraft_limit", "metadata", "other", "account\\u005fid", "Amount"}
	seps := []string{"", " ", "\n", "\t", "\r", "\x00", "\v"}
	rng := rand.New(rand.NewSource(5))
	took := 0
	for range 200000 {
		typ := ClientCommandTypes[rng.Intn(len(ClientCommandTypes))]
		// Start from a valid body's fields, then mutate some.
		type kv struct{ name, value string }
		var fields []kv
		for _, part := range strings.Split(strings.Trim(strings.TrimSpace(plain[typ]), "{} \n\t\r"), ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(part), ":")
			fields = append(fields, kv{strings.Trim(strings.TrimSpace(name), `"`), strings.TrimSpace(value)})
		}
		for range rng.Intn(3) {
			i := rng.Intn(len(fields))
			switch rng.Intn(6) {
			case 0:
				fields[i].value = values[rng.Intn(len(values))]
			case 1:
				fields[i].name = names[rng.Intn(len(names))]
			case 2:
				fields = append(fields, fields[i])
			case 3:
				fields = append(fields[:i], fields[i+1:]...)
			case 4:
				fields = append(fields, kv{names[rng.Intn(len(names))], values[rng.Intn(len(values))]})
			case 5:
				j := rng.Intn(len(fields))
				fields[i], fields[j] = fields[j], fields[i]
			}
			if len(fields) == 0 {
				break
			}
		}
		sep := func() string {
			if rng.Intn(4) == 0 {
				return seps[rng.Intn(len(seps))]
			}
			return ""
		}
		var b strings.Builder
		b.WriteString(sep() + "{")
		for i, f := range fields {
			if i > 0 {
				b.WriteString(sep() + "," + sep())
			}
			b.WriteString(`"` + f.name + `"` + sep() + ":" + sep() + f.value)
		}
		b.WriteString(sep() + "}" + sep())
		body := b.String()
		if rng.Intn(20) == 0 {
			body = body[:rng.Intn(len(body)+1)]
		}
		if checkFastDecode(t, typ, []byte(body)) {
			took++
		}
	}
	t.Logf("the fast path took %d of the random bodies", took)
	if took < 1000 {
		t.Errorf("the fast path took only %d random bodies: the comparison covers too little", took)
	}
}
