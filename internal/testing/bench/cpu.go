package bench

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is a point-in-time reading of CPU time: this process (the clients,
// NATS, the ledger or the baseline handler all run in it), the PostgreSQL server's
// processes, and the whole machine. Differences of two samples tell what a phase
// used, and so what bounded it (PostgreSQL backends live outside Go's profiler).
type cpuSample struct {
	at       time.Time
	self     time.Duration
	postgres time.Duration
	busy     time.Duration // all CPUs, whole machine
	ok       bool          // the /proc readings worked
}

// clockTick is USER_HZ, 100 on every Linux the ledger targets.
const clockTick = 10 * time.Millisecond

func sampleCPU(postmasterPID int) cpuSample {
	s := cpuSample{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	busy, ok := machineBusy()
	s.busy, s.ok = busy, ok
	if postmasterPID > 0 {
		s.postgres = treeCPU(postmasterPID)
	}
	return s
}

// machineBusy reads the non-idle time of all CPUs from /proc/stat.
func machineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 8 { // guest time is already counted in user
			break
		}
		busy += n
	}
	return time.Duration(busy) * clockTick, true
}

// treeCPU sums user+system time of pid and its direct children (the postmaster
// and its backends).
func treeCPU(pid int) time.Duration {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var total int64
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses and may hold spaces.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if p != pid && ppid != pid {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += ut + st
	}
	return time.Duration(total) * clockTick
}

// postmasterPID reads the PID of the server running on dataDir (0 if unknown).
func postmasterPID(dataDir string) int {
	f, err := os.Open(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(sc.Text()))
	return pid
}

// CPUUse is what a phase used, in cores (CPU seconds per wall second).
type CPUUse struct {
	Bench    float64 `json:"bench_cores"`    // this process: clients, NATS server, the system under test
	Postgres float64 `json:"postgres_cores"` // the PostgreSQL server
	Other    float64 `json:"other_cores"`    // everything else on the machine (other users' work)
	Cores    int     `json:"machine_cores"`
}

func cpuBetween(a, b cpuSample, cores int) *CPUUse {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 || !a.ok || !b.ok {
		return nil
	}
	self := (b.self - a.self).Seconds() / wall
	pg := (b.postgres - a.postgres).Seconds() / wall
	busy := (b.busy - a.busy).Seconds() / wall
	return &CPUUse{Bench: self, Postgres: pg, Other: max(0, busy-self-pg), Cores: cores}
}
