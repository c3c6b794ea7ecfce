package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// proc is one child process of the suite (nats-server, ledger serve, projector
// run), in its own process group, with its output in a log file.
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "\n=== %s start %s\n", time.Now().Format(time.RFC3339Nano), p.name)
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(done) }()
	p.cmd, p.done = cmd, done
	return nil
}

// running reports whether the process is alive.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL to the process group and waits (bounded) for it to go.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL, 10*time.Second)
}

// stop sends SIGTERM, and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if !p.signal(syscall.SIGTERM, grace) {
		p.kill()
	}
}

func (p *proc) signal(sig syscall.Signal, wait time.Duration) bool {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return true
	}
	syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-done:
		return true
	case <-time.After(wait):
		return false
	}
}

// waitHTTP polls url until it answers 200, bounded by timeout.
func waitHTTP(ctx context.Context, url string, timeout time.Duration, alive func() bool) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if alive != nil && !alive() {
			return fmt.Errorf("%s: the process exited", url)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s", url, timeout)
}

// waitTCP polls addr until it accepts a connection, bounded by timeout.
func waitTCP(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not accepting after %s", addr, timeout)
}

// buildBinaries builds the ledger and the projector once into dir.
func buildBinaries(ctx context.Context, dir string) (ledger, projector, self string, err error) {
	ledger = filepath.Join(dir, "ledger")
	projector = filepath.Join(dir, "projector")
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	out, berr := exec.CommandContext(bctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/ledger", "./cmd/projector").CombinedOutput()
	if berr != nil {
		return "", "", "", fmt.Errorf("go build: %w\n%s", berr, out)
	}
	self, err = os.Executable()
	if err != nil {
		return "", "", "", err
	}
	return ledger, projector, self, nil
}

// readPID reads the first line of a postmaster.pid.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for i, c := range b {
		if c == '\n' {
			b = b[:i]
			break
		}
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil || pid <= 0 {
		return 0, errors.New("bad postmaster.pid")
	}
	return pid, nil
}
