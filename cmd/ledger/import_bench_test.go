package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

// BenchmarkHistoryImport measures a history import (PROTOCOL.md §2.3, the
// README's recipe): `ledger post --file` of importLines historical lines (50
// accounts opened and funded, then deposits and transfers, every line with a
// past effective_at), against a baseline in the same run: the same lines under
// other keys and accounts, without effective_at. Both go to one `ledger dev`
// (its private PostgreSQL, or LEDGER_TEST_DATABASE_URL), in turns, baseline
// first, each run a file of its own; it reports each run's commands per
// second (wall time of the whole `ledger post --file`, projector running
// alongside as in production) and the ratio, and logs the load average
// beside them. Run it with BENCHMARKS.md's command; b.N runs of each.
func BenchmarkHistoryImport(b *testing.B) {
	dir := b.TempDir()
	startDev(b, dir, []string{"--nats-addr", "127.0.0.1:0"}, []string{config.EnvDatabaseURL + "=" + pgtest.URL(b)})
	env := []string{config.EnvDataDir + "=" + dir}
	lines := importLines()
	var historical, baseline time.Duration
	for i := range b.N {
		for _, hist := range importModes() {
			prefix := fmt.Sprintf("b%d", i)
			if hist {
				prefix = fmt.Sprintf("h%d", i)
			}
			file := filepath.Join(b.TempDir(), prefix+".jsonl")
			importFile(b, file, prefix, lines, hist)
			start := time.Now()
			out, code := postFileCLI(b, env, nil, "--file", file)
			took := time.Since(start)
			if code != exitApplied || summaryCount(b, out, "applied") != lines {
				b.Fatalf("import %s: exit %d:\n%s", prefix, code, out)
			}
			load, _ := os.ReadFile("/proc/loadavg")
			b.Logf("run %d, %s: %d lines in %s: %.0f commands/s (load average %s)", i+1, map[bool]string{true: "historical", false: "baseline"}[hist],
				lines, took.Round(time.Millisecond), float64(lines)/took.Seconds(), strings.TrimSpace(string(load)))
			if hist {
				historical += took
			} else {
				baseline += took
			}
		}
	}
	b.ReportMetric(float64(lines*b.N)/historical.Seconds(), "historical-cmds/s")
	if baseline > 0 {
		b.ReportMetric(float64(lines*b.N)/baseline.Seconds(), "baseline-cmds/s")
		b.ReportMetric(baseline.Seconds()/historical.Seconds(), "historical/baseline")
	}
}

// importModes are the runs of each iteration, historical or not: the baseline
// then the historical import, or the historical one alone with
// LEDGER_BENCH_IMPORT_HISTORICAL_ONLY=1 (to compare two builds, alternated:
// BENCHMARKS.md).
func importModes() []bool {
	if os.Getenv("LEDGER_BENCH_IMPORT_HISTORICAL_ONLY") == "1" {
		return []bool{true}
	}
	return []bool{false, true}
}

// importLines is how many lines each import run posts: 100,000, or
// LEDGER_BENCH_IMPORT_LINES.
func importLines() int { return linesFromEnv("LEDGER_BENCH_IMPORT_LINES", 100_000) }

// linesFromEnv is the number of lines in the environment variable name (more
// than 100), or def when it is unset or not such a number.
func linesFromEnv(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err == nil && n > 100 {
		return n
	}
	return def
}
