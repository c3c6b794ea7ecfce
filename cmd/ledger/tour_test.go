package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/projections"
)

// tourStep is one `ledger post` (or `ledger balances`, a query) line of the
// README's tour and what it shows.
type tourStep struct {
	line   string
	args   []string
	query  bool
	expect map[string]any
}

// readTour extracts the tour from README.md: each `go run ./cmd/ledger post ...`
// line of the tour's code block, and the `#  → "k": v, ...` line under it.
func readTour(t *testing.T) []tourStep {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if !strings.HasPrefix(text, "# ledger\n\n```sh\ngo run ./cmd/ledger dev ") || !strings.Contains(text, "\nbash .ci/run ") {
		t.Fatal("README.md does not start with the two set-up commands")
	}
	text = readmeBlock(t, text, "## A five-minute tour")
	var steps []tourStep
	const prefix, queryPrefix = "go run ./cmd/ledger post ", "go run ./cmd/ledger balances "
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, prefix):
			steps = append(steps, tourStep{line: line, args: strings.Fields(strings.TrimPrefix(line, prefix))})
		case strings.HasPrefix(line, queryPrefix):
			steps = append(steps, tourStep{line: line, args: strings.Fields(strings.TrimPrefix(line, "go run ./cmd/ledger ")), query: true})
		case strings.HasPrefix(line, "#  → "):
			if len(steps) == 0 {
				t.Fatalf("expectation before any command: %s", line)
			}
			var exp map[string]any
			if err := json.Unmarshal([]byte("{"+strings.TrimPrefix(line, "#  → ")+"}"), &exp); err != nil {
				t.Fatalf("README tour: %q: %v", line, err)
			}
			steps[len(steps)-1].expect = exp
		case strings.TrimSpace(line) != "":
			t.Fatalf("README tour: unexpected line %q", line)
		}
	}
	if len(steps) < 5 {
		t.Fatalf("README tour has %d steps", len(steps))
	}
	return steps
}

// readmeBlock is the first sh code block of the README's section heading.
func readmeBlock(t *testing.T, readme, heading string) string {
	t.Helper()
	start := strings.Index(readme, heading)
	if start < 0 {
		t.Fatalf("README.md has no %q", heading)
	}
	text := readme[start:]
	i := strings.Index(text, "```sh\n")
	if i < 0 {
		t.Fatalf("README.md: no sh block under %q", heading)
	}
	text = text[i+6:]
	return text[:strings.Index(text, "```")]
}

// holds reports whether v, or any value nested in it, has key with the value want.
func holds(v any, key string, want any) bool {
	switch x := v.(type) {
	case map[string]any:
		if got, ok := x[key]; ok && reflect.DeepEqual(got, want) {
			return true
		}
		for _, e := range x {
			if holds(e, key, want) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if holds(e, key, want) {
				return true
			}
		}
	}
	return false
}

// The README's tour, run line by line against `ledger dev` as a newcomer would
// (`ledger post` finds the dev through the data dir; here LEDGER_DATA_DIR).
func TestReadmeTour(t *testing.T) {
	steps := readTour(t)
	dir := t.TempDir()
	dev := startDev(t, dir, []string{"--nats-addr", "127.0.0.1:0"}, []string{config.EnvDatabaseURL + "=" + pgtest.URL(t)})
	env := []string{config.EnvDataDir + "=" + dir}
	for _, s := range steps {
		if s.query {
			checkTourQuery(t, env, s)
			continue
		}
		reply, out, code := postCLI(t, env, s.args...)
		if reply == nil {
			t.Fatalf("%s\nno reply (exit %d):\n%s", s.line, code, out)
		}
		for k, want := range s.expect {
			if !holds(reply, k, want) {
				t.Errorf("%s\nwant %q: %v in\n%s", s.line, k, want, out)
			}
		}
		wantCode := exitAnswered
		if reply["status"] == "applied" {
			wantCode = exitApplied
		}
		if code != wantCode {
			t.Errorf("%s\nexit status %d, want %d", s.line, code, wantCode)
		}
	}
	checkReadmeFile(t, env)
	checkTourEvents(t, dir)
	checkTourStatement(t, env)
	checkTourLateSettlement(t, env)
	dev.stop()
	if _, _, err := config.ReadDevInfo(dir); err == nil {
		t.Error("dev.json left after a clean stop")
	}
}

// checkTourQuery runs a query line of the tour until its reply shows what the
// README says (the read models catch up with the writes before it), exit 0.
func checkTourQuery(t *testing.T, env []string, s tourStep) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, stderr, code := runLedger(t, env, nil, s.args...)
		var reply map[string]any
		_ = json.Unmarshal(out, &reply)
		missing := ""
		for k, want := range s.expect {
			if !holds(reply, k, want) {
				missing += fmt.Sprintf(" %q: %v", k, want)
			}
		}
		if code == 0 && missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s\nexit %d, want 0, and%s in\n%s%s", s.line, code, missing, out, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkTourEvents: the tour's events reach LEDGER_EVENTS (PROTOCOL.md §4.1), the
// last deposit among them, as the README says `nats sub` shows.
func checkTourEvents(t *testing.T, dir string) {
	t.Helper()
	info, _, err := config.ReadDevInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(info.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		s, err := js.Stream(ctx, projections.EventsStream)
		if err == nil {
			m, err := s.GetLastMsgForSubject(ctx, projections.EventSubject("account-alice", domain.EvHoldCaptured))
			if err == nil {
				var ev projections.EventMessage
				if err := json.Unmarshal(m.Data, &ev); err != nil || ev.Stream != "account-alice" || m.Header.Get(jetstream.MsgIDHeader) != ev.ID.String() {
					t.Fatalf("the tour's capture on LEDGER_EVENTS: %s (%v)", m.Data, err)
				}
				if ev.IdempotencyKey == "settle-1" { // the last capture (cap-1's comes first)
					return
				}
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("the tour's capture never reached %s: %v", projections.EventsStream, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkTourStatement: `ledger statement alice --csv` lists alice's money
// movements of the tour between an opening balance of 0 and a closing balance
// that the entries add up to and the account shows.
func checkTourStatement(t *testing.T, env []string) {
	t.Helper()
	acct, out, code := postCLI(t, env, "--query", "--key", "settle-1") // the last write: the projector catches up to it below
	if code != exitApplied || acct == nil {
		t.Fatalf("query settle-1: %s", out)
	}
	var rows [][]string
	deadline := time.Now().Add(30 * time.Second)
	for {
		cmd := exec.Command(ledgerBinary(t), "statement", "alice", "--csv")
		cmd.Env = append(os.Environ(), env...)
		b, err := cmd.Output()
		if err == nil {
			if rows, err = csv.NewReader(bytes.NewReader(b)).ReadAll(); err != nil {
				t.Fatal(err)
			}
			if len(rows) == 9 || time.Now().After(deadline) { // header, opening, dep-1, transfer, capture, refund, order-1, settle-1, closing
				break
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("ledger statement: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(rows) != 9 || rows[1][3] != "opening_balance" || rows[1][5] != "0" || rows[8][3] != "closing_balance" {
		t.Fatalf("statement rows: %v", rows)
	}
	sum := int64(0)
	for _, r := range rows[2:8] {
		n, err := strconv.ParseInt(r[4], 10, 64)
		if err != nil {
			t.Fatalf("row %v: %v", r, err)
		}
		sum += n
	}
	if rows[8][5] != strconv.FormatInt(sum, 10) || rows[7][5] != rows[8][5] || rows[3][7] != "tr-1" || rows[6][8] != "order-1" {
		t.Fatalf("closing balance %s, entries add up to %d; rows %v", rows[8][5], sum, rows)
	}
}

// checkReadmeFile runs the README's `ledger post --file` block after the
// tour: the file its heredoc writes, each run of it and the summary and exit
// status written under it.
func checkReadmeFile(t *testing.T, env []string) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := readmeBlock(t, string(b), "### Many commands at once")
	const heredoc, run = "cat > payouts.jsonl <<'EOF'\n", "go run ./cmd/ledger post --file payouts.jsonl"
	i := strings.Index(text, heredoc)
	j := strings.Index(text, "\nEOF\n")
	if i < 0 || j < i {
		t.Fatalf("README --file block: no heredoc:\n%s", text)
	}
	path := filepath.Join(t.TempDir(), "payouts.jsonl")
	if err := os.WriteFile(path, []byte(text[i+len(heredoc):j+1]), 0o644); err != nil {
		t.Fatal(err)
	}
	runs := 0
	lines := strings.Split(text[j+5:], "\n")
	for k := 0; k < len(lines); k++ {
		if strings.TrimSpace(lines[k]) == "" {
			continue
		}
		if lines[k] != run || k+1 == len(lines) {
			t.Fatalf("README --file block: unexpected line %q", lines[k])
		}
		var applied, dup, rejected, invalid, exit int
		if _, err := fmt.Sscanf(lines[k+1], "#  → applied %d, duplicate %d, rejected %d, invalid %d, exit %d", &applied, &dup, &rejected, &invalid, &exit); err != nil {
			t.Fatalf("README --file block: %q: %v", lines[k+1], err)
		}
		out, code := postFileCLI(t, env, nil, "--file", path)
		if code != exit || summaryCount(t, out, "applied") != applied || summaryCount(t, out, "duplicate") != dup ||
			summaryCount(t, out, "rejected") != rejected || summaryCount(t, out, "invalid") != invalid {
			t.Errorf("%s (run %d): exit %d, want %s\n%s", run, runs+1, code, lines[k+1], out)
		}
		runs++
		k++
	}
	if runs < 2 {
		t.Fatalf("README --file block runs the file %d times, want the run and its rerun", runs)
	}
}

// checkTourLateSettlement: the README's late settlement, booked today
// effective March 31, is March's by effective time (`ledger statement
// --by effective` over March: one entry, closing 4200, its effective_at in
// the CSV's last column) and not by record time (March is empty).
func checkTourLateSettlement(t *testing.T, env []string) {
	t.Helper()
	march := []string{"statement", "acquirer", "--csv", "--from", "2026-03-01T00:00:00Z", "--to", "2026-04-01T00:00:00Z"}
	var rows [][]string
	devtest.Eventually(t, 30*time.Second, "the late settlement in March's statement by effective time", func() bool {
		out, _, code := runLedger(t, env, nil, append(march, "--by", "effective")...)
		var err error
		rows, err = csv.NewReader(bytes.NewReader(out)).ReadAll()
		return code == 0 && err == nil && len(rows) == 4
	})
	if rows[2][3] != "Credited" || rows[2][4] != "4200" || rows[2][11] != "2026-03-31T22:00:00Z" || rows[3][3] != "closing_balance" || rows[3][5] != "4200" || rows[1][5] != "0" {
		t.Fatalf("March by effective time: %v", rows)
	}
	out, _, code := runLedger(t, env, nil, march...)
	if rows, err := csv.NewReader(bytes.NewReader(out)).ReadAll(); code != 0 || err != nil || len(rows) != 3 || rows[2][5] != "0" {
		t.Fatalf("March by record time: exit %d %v: %s", code, err, out)
	}
}
