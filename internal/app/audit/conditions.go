package audit

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// checkConditions checks the conditions of PROTOCOL.md v1.2 §2.3 on an account
// event against the fold after it (a, the event folded): a command with
// expected_revision applied, or was refused for another reason, only when the
// account stood at that revision, and was refused with revision_mismatch only
// when it did not; a debit with up_to (Requested) moved at most what it asked
// and never into the overdraft, and moved less only when it took all that was
// available.
func (f *Fold) checkConditions(re eventstore.RecordedEvent, m domain.Metadata, a *domain.Account, payload any) {
	if p, ok := payload.(*domain.Debited); ok && p.Requested != nil {
		f.checkSweep(re, a, p)
	}
	if m.Index != 0 || m.Origin != "" || !namesExpectedRevision(re.Metadata) {
		return
	}
	expected, err := expectedRevision(re.Metadata)
	if err != nil {
		f.eventViolation(InvBalance, "condition_unreadable", re, "the request of %q names expected_revision, unreadable: %v", m.Key, err)
		return
	}
	before := int64(re.Revision) - 1 // the account's revision when the command was decided
	refused, isRejection := payload.(*domain.CommandRejected)
	mismatch := isRejection && refused.Code == domain.CodeRevisionMismatch
	if mismatch == (expected == before) {
		f.eventViolation(InvBalance, "revision_condition", re, "%q expected revision %d on %s at revision %d, yet the event is %s", m.Key, expected, a.ID, before, re.Type)
	}
}

// expectedRevisionB64 are `"expected_revision":` as it reads inside base64 at
// each of the three alignments it may have: the fold decodes no canonical
// request (domain.DecodeMetadataNoRequest), so the few that name expected_revision are found
// in the metadata's base64 first (a false match only costs a decode).
var expectedRevisionB64 = func() [3][]byte {
	needle := []byte(`"expected_revision":`)
	var out [3][]byte
	for o := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, o), needle...))
		out[o] = []byte(enc[(8*o+5)/6 : 8*(o+len(needle))/6])
	}
	return out
}()

// namesExpectedRevision reports whether an event's metadata may hold a
// canonical request naming expected_revision.
func namesExpectedRevision(metadata []byte) bool {
	for _, p := range expectedRevisionB64 {
		if bytes.Contains(metadata, p) {
			return true
		}
	}
	return false
}

// expectedRevision is the expected_revision of the canonical request in an
// event's metadata.
func expectedRevision(metadata []byte) (int64, error) {
	var m struct {
		Request []byte `json:"request"`
	}
	if err := json.Unmarshal(metadata, &m); err != nil {
		return 0, err
	}
	req, err := domain.ParseRequest(m.Request)
	if err != nil {
		return 0, err
	}
	v, ok := req["expected_revision"].(int64)
	if !ok {
		return 0, fmt.Errorf("no expected_revision in %s", m.Request)
	}
	return v, nil
}

// checkSweep checks a debit with up_to, p, folded into a.
func (f *Fold) checkSweep(re eventstore.RecordedEvent, a *domain.Account, p *domain.Debited) {
	switch {
	case p.Amount <= 0 || p.Amount > *p.Requested:
		f.eventViolation(InvBalance, "sweep_mismatch", re, "a debit with up_to %d moved %d", *p.Requested, p.Amount)
	case a.Available() < 0:
		f.eventViolation(InvBalance, "sweep_mismatch", re, "a debit with up_to moved %d into the overdraft of %s (available %d after it)", p.Amount, a.ID, a.Available())
	case p.Amount < *p.Requested && a.Available() != 0:
		f.eventViolation(InvBalance, "sweep_mismatch", re, "a debit with up_to %d moved %d, leaving %d available on %s", *p.Requested, p.Amount, a.Available(), a.ID)
	}
}
