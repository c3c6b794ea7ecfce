package projections_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuClock reads the CPU time spent so far by this process and by the
// PostgreSQL cluster the benchmark's pool is on, so that a benchmark can
// report what a part cost in CPU beside its wall (on a loaded machine the
// wall is mostly other processes' turns; the CPU is what a quiet one turns
// into wall). The cluster's is read from /proc: its postmaster (the first
// line of postmaster.pid in the server's data_directory) with its exited
// children's time, and its live children's; a backend that was alive at
// the first reading and exited before the second counts its time before the
// first twice. It is -1 where the cluster is not on this machine or /proc
// is not readable (another user's server, a role that may not read
// data_directory).
type cpuClock struct {
	pool   *pgxpool.Pool
	dir    string // the server's data_directory; "" when not readable
	clktck float64
}

func newCPUClock(b *testing.B, pool *pgxpool.Pool) *cpuClock {
	b.Helper()
	c := &cpuClock{pool: pool, clktck: 100} // USER_HZ: 100 on Linux's every architecture
	if err := pool.QueryRow(context.Background(), `SELECT current_setting('data_directory')`).Scan(&c.dir); err != nil {
		b.Logf("PostgreSQL's CPU not read: %v", err)
		c.dir = ""
	}
	return c
}

// process is this process's user and system CPU time.
func (c *cpuClock) process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// server is the cluster's CPU time so far, or -1 (cpuClock).
func (c *cpuClock) server() time.Duration {
	if c.dir == "" {
		return -1
	}
	pidFile, err := os.ReadFile(filepath.Join(c.dir, "postmaster.pid"))
	if err != nil {
		return -1
	}
	pm, _, _ := strings.Cut(string(pidFile), "\n")
	fields, ok := procStat(pm)
	if !ok {
		return -1
	}
	ticks := statTicks(fields, 11, 12, 13, 14) // utime, stime, cutime, cstime
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		if f, ok := procStat(p.Name()); ok && f[1] == pm {
			ticks += statTicks(f, 11, 12)
		}
	}
	return time.Duration(float64(ticks) / c.clktck * float64(time.Second))
}

// procStat is /proc/<pid>/stat's fields after the command's name: the
// state first (field 3 of proc(5)), the parent's pid second.
func procStat(pid string) ([]string, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, false
	}
	f := strings.Fields(string(b[i+1:]))
	return f, len(f) > 14
}

// statTicks sums procStat's fields at the indexes given (proc(5)'s field
// number less 3).
func statTicks(f []string, at ...int) int64 {
	var n int64
	for _, i := range at {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		n += v
	}
	return n
}

// cpuSpent is what a part cost: the process's CPU and the cluster's.
type cpuSpent struct{ process, server time.Duration }

// start reads both clocks; the function it returns reads them again and
// adds what was spent between to into (the server's left at -1 once either
// reading failed).
func (c *cpuClock) start(into *cpuSpent) func() {
	p0, s0 := c.process(), c.server()
	return func() {
		p1, s1 := c.process(), c.server()
		into.process += p1 - p0
		if s0 < 0 || s1 < 0 || into.server < 0 {
			into.server = -1
			return
		}
		into.server += s1 - s0
	}
}

// reportCPU reports what part cost in CPU a run: <part>-cpu-s, the
// process's, and <part>-pg-cpu-s, the cluster's (not reported when it could
// not be read).
func reportCPU(b *testing.B, part string, spent cpuSpent) {
	b.ReportMetric(spent.process.Seconds()/float64(b.N), part+"-cpu-s")
	if spent.server >= 0 {
		b.ReportMetric(spent.server.Seconds()/float64(b.N), part+"-pg-cpu-s")
	}
}
