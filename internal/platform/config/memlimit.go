package config

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"
)

// FlagMemoryLimit is --memory-limit (LEDGER_MEMORY_LIMIT).
const (
	FlagMemoryLimit = "memory-limit"
	EnvMemoryLimit  = "LEDGER_MEMORY_LIMIT"
)

// ReadToolMemoryLimit is the soft memory limit of the tools that read the
// whole history (audit, rebuild, replay, and the bench's history phase that
// runs them): what the Go runtime may hold (heap, stacks, metadata) before it
// collects more often than GOGC asks. With ReadToolGOGC's goal above it once
// the live heap is large, the limit sets when the collector runs, so the peak
// RSS stays near the limit: at
// 448 MiB, 447.1 and 451.0 MiB for the rebuild and the audit of 10,000,000
// events over 100,000 accounts (quiet), 61-65 MiB under the 512 MiB;
// at 384 MiB the collector took a quarter of the rebuild's CPU for 394 MiB
// (BENCHMARKS.md, "448 MiB and GOGC 200"). It is soft: a live heap above it
// is not an error, the collector then runs more (at most half the CPU, Go's
// limiter) and the process grows past it.
const ReadToolMemoryLimit = "448MiB"

// MemoryLimitFlag is a flag of a soft memory limit (SetMemoryLimit) with def
// as its default; when says when it applies ("" for the whole run).
func MemoryLimitFlag(name, def, when string, sources cli.ValueSourceChain) *cli.StringFlag {
	return &cli.StringFlag{Name: name, Value: def, Sources: sources,
		Usage: "soft memory limit of the Go runtime" + when + ", as Go's GOMEMLIMIT (bytes with an optional unit B, KiB, MiB, GiB or TiB, or off): the collector runs more often rather than let the process grow past it; a GOMEMLIMIT in the environment wins over this default"}
}

// memoryUnits are GOMEMLIMIT's units.
var memoryUnits = []struct {
	suffix string
	bytes  int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// ParseMemoryLimit parses GOMEMLIMIT's syntax: off (no limit, math.MaxInt64)
// or a positive integer of bytes with an optional unit.
func ParseMemoryLimit(v string) (int64, error) {
	if v == "off" {
		return math.MaxInt64, nil
	}
	num, unit := v, int64(1)
	for _, u := range memoryUnits {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			num, unit = n, u.bytes
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/unit {
		return 0, fmt.Errorf("config: memory limit %q: want a positive number of bytes with an optional unit (B, KiB, MiB, GiB, TiB), or off", v)
	}
	return n * unit, nil
}

// SetMemoryLimit applies v (ParseMemoryLimit's syntax) as the runtime's soft
// memory limit, unless explicit is false and the environment has GOMEMLIMIT
// (the runtime applied it at start: the user's choice wins over a default).
// restore puts back the limit before; a v that does not parse changes nothing.
func SetMemoryLimit(v string, explicit bool) (restore func(), err error) {
	if !explicit && os.Getenv("GOMEMLIMIT") != "" {
		return func() {}, nil
	}
	n, err := ParseMemoryLimit(v)
	if err != nil {
		return nil, err
	}
	before := debug.SetMemoryLimit(n)
	return func() { debug.SetMemoryLimit(before) }, nil
}

// memoryLimitFromCommand applies cmd's --memory-limit, where it has one.
func memoryLimitFromCommand(cmd *cli.Command) error {
	if cmd.Value(FlagMemoryLimit) == nil {
		return nil
	}
	if _, err := SetMemoryLimit(cmd.String(FlagMemoryLimit), cmd.IsSet(FlagMemoryLimit)); err != nil {
		return fmt.Errorf("--%s (%s): %w", FlagMemoryLimit, EnvMemoryLimit, err)
	}
	return nil
}
