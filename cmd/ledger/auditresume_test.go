package main

import (
	"strings"
	"testing"
)

// TestAuditResumeFlag: `ledger audit --resume` without a stop point says so
// and exits 2, as does --resume with --from or --account (invalid), and
// --expect-digest without --from or --resume; LEDGER_AUDIT_RESUME sets it.
func TestAuditResumeFlag(t *testing.T) {
	env, _ := auditedLedger(t, 1)
	for _, c := range []struct {
		env  []string
		args []string
		said string
	}{
		{nil, []string{"audit", "--resume"}, "no stop point is stored"},
		{[]string{"LEDGER_AUDIT_RESUME=true"}, []string{"audit"}, "no stop point is stored"},
		{nil, []string{"audit", "--resume", "--from", "last"}, "not with --from or --account"},
		{nil, []string{"audit", "--resume", "--account", "a"}, "not with --from or --account"},
		{nil, []string{"audit", "--expect-digest", "ab"}, "give the checkpoint (--from) or --resume"},
	} {
		out, stderr, code := runLedger(t, append(env, c.env...), nil, append(c.args, "--log-level", "warn")...)
		if code != 2 || !strings.Contains(stderr, c.said) {
			t.Errorf("%v %v: exit %d, want 2 saying %q:\n%s%s", c.env, c.args, code, c.said, out, stderr)
		}
	}
}
