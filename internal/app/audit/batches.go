package audit

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Atomic batches (PROTOCOL.md v1.2 §2.2). A batch's key stream holds its
// BatchDecided, which is also its key's claim (once, like any claim:
// applyKeyStream). An applied batch decides its elements' keys in its one
// append: every element not answered as a duplicate has its claim written
// after the batch's decision. noteBatch notes them, a claim met later strikes
// one off, and finishBatches names every element an applied batch left
// undecided. The batch's key has its row in the commands read model: the
// reply its decision records (reply.BatchDecided).

// noteBatch notes the elements an applied batch decided (re, a BatchDecided).
func (f *Fold) noteBatch(re eventstore.RecordedEvent) {
	var d domain.BatchDecided
	if err := json.Unmarshal(re.Data, &d); err != nil {
		f.eventViolation(InvKeyOnce, "bad_claim", re, "undecodable batch decision: %v", err)
		return
	}
	r, err := reply.BatchDecided(&d)
	if err != nil {
		f.eventViolation(InvKeyOnce, "bad_claim", re, "%v", err)
		return
	}
	if !f.NoRows { // the commands read model's row of the batch's key
		f.sets.row(f, "commands", d.Key, "", digestNote(replyRow(r)))
	}
	if d.Status != domain.StatusApplied {
		return
	}
	if f.batchElements == nil {
		f.batchElements = map[string]string{}
	}
	for i, k := range d.Keys {
		if !slices.Contains(d.Duplicates, i) {
			f.batchElements[k] = d.Key
		}
	}
}

// finishBatches names the elements of applied batches whose keys were never
// claimed.
func (f *Fold) finishBatches() {
	keys := make([]string, 0, len(f.batchElements))
	for k := range f.batchElements {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		batch := f.batchElements[k]
		f.violate(Violation{Invariant: InvKeyOnce, Kind: "batch_element_undecided", Stream: domain.KeyStream(batch),
			Message: fmt.Sprintf("atomic batch %q applied, but its element %q was not decided with it", batch, k)})
	}
}
