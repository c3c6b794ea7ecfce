package devtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

// Program is a command of this repository that tests build once per test
// binary (go build, into the directory RunPrograms makes) and run as a user
// runs it.
type Program struct {
	Name    string // the binary's
	Package string // relative to the test's package: "." or "../projector"
	once    sync.Once
	path    string
	err     error
}

// programsDir holds the programs this test binary built (RunPrograms).
var programsDir string

// RunPrograms is pgtest.Run for a test binary whose tests build Programs:
// it makes their directory first and removes it once the tests ran.
func RunPrograms(m *testing.M) int {
	var err error
	programsDir, err = os.MkdirTemp("", "ledger-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := pgtest.Run(m)
	if err := os.RemoveAll(programsDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code
}

// Path builds p once (a failed build fails t, and every later Path) and
// returns its binary's path.
func (p *Program) Path(t testing.TB) string {
	t.Helper()
	p.once.Do(func() {
		if programsDir == "" {
			p.err = fmt.Errorf("devtest: %s built outside RunPrograms", p.Name)
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		p.path = filepath.Join(programsDir, p.Name)
		if out, err := exec.Command(goBin, "build", "-o", p.path, p.Package).CombinedOutput(); err != nil {
			p.err = fmt.Errorf("go build %s: %v\n%s", p.Package, err, out)
		}
	})
	if p.err != nil {
		t.Fatal(p.err)
	}
	return p.path
}
