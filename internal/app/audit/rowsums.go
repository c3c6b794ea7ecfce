package audit

import (
	"maps"
	"slices"
)

// idKeyed are the hashed tables whose row key is its event's ID: a key of
// theirs is noted twice only when an event ID is stored twice (invariant 5).
// With none, each row noted up to a seq is expected (expectedRows' DISTINCT
// ON keeps them all), so the expected digest is the sum of their hashes,
// which the sets add up as they note them (rowSums): PostgreSQL need not sort
// the table's rows (about 650,000 of 1,200,000 at 1,000,000 events) to find
// the last of each key when the table matches.
var idKeyed = map[string]bool{"entries": true, "balance_history": true}

// rowSums are the digests of the rows of idKeyed's tables noted in this
// process: of every one (cur), and as of each seq marked, sealed when the
// first row after it is noted (at). whole: the sets' rows were all noted
// here (not a resumed run's sets, which hold its stopped run's rows too).
type rowSums struct {
	whole bool
	last  int64   // the seq of the last row noted
	open  []int64 // the seqs marked, ascending, no row after them noted yet
	cur   map[string]digester
	at    map[int64]map[string]digester
}

// add adds a row of table noted at seq (its hash, rowHash), sealing the marks
// before seq first.
func (r *rowSums) add(table string, seq int64, sum []byte) {
	if r.cur == nil {
		r.cur, r.at = map[string]digester{}, map[int64]map[string]digester{}
	}
	for len(r.open) > 0 && r.open[0] < seq {
		r.at[r.open[0]] = maps.Clone(r.cur)
		r.open = r.open[1:]
	}
	d := r.cur[table]
	d.addHash(sum)
	r.cur[table], r.last = d, seq
}

// mark asks for the sums as of seq, the fold's event count when a read
// model's expectation is taken; a seq before a row already noted is not
// kept (asOf then answers nothing: the sets' query does).
func (r *rowSums) mark(seq int64) {
	if seq >= r.last && !slices.Contains(r.open, seq) && (len(r.open) == 0 || seq > r.open[len(r.open)-1]) {
		r.open = append(r.open, seq)
	}
}

// asOf is the digest of the rows of table noted up to seq, if marked.
func (r *rowSums) asOf(table string, seq int64) (digester, bool) {
	if d, ok := r.at[seq]; ok {
		return d[table], true
	}
	if slices.Contains(r.open, seq) {
		return r.cur[table], true
	}
	return digester{}, false
}

// expectedSum is the expected digest of a table up to seq from the sums, when
// it equals expectedRows' answer: a full comparison (not noted, not of one
// account) of an idKeyed table, every row noted here, no event ID found
// twice (idsUnique: finish checked them).
func (s *pgSets) expectedSum(table, account string, seq int64, noted bool) (digester, bool) {
	if noted || account != "" || !idKeyed[table] || !s.idsUnique || !s.sums.whole {
		return digester{}, false
	}
	return s.sums.asOf(table, seq)
}
