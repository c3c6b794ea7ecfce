package bench

import (
	"math"
	"math/rand/v2"
	"sort"
	"strconv"

	"github.com/ledgerworks/ledger/domain"
)

// workload generates commands: deposits and withdrawals over Accounts accounts
// chosen with a Zipf-like skew, each under a new key, or, with the duplicate ratio,
// a command already answered resent with its key and body unchanged.
type workload struct {
	runID    string
	accounts []string
	cdf      []float64 // cumulative weights; nil: uniform
	currency string
	// all are every account (a transaction's other account is drawn from
	// them, also in the hot phase); txRatio is the share of new commands that
	// are transactions.
	all     []string
	txRatio float64
}

// overdraftLimit lets withdrawals always pass, so that both systems apply every
// new command and the comparison is about the machinery, not about rejections.
const overdraftLimit = 1_000_000_000_000

func newWorkload(runID string, accounts int, skew, txRatio float64) *workload {
	w := &workload{runID: runID, currency: "EUR", accounts: make([]string, accounts), txRatio: txRatio}
	for i := range w.accounts {
		w.accounts[i] = w.prefix() + strconv.Itoa(i)
	}
	w.all = w.accounts
	if skew > 0 {
		// Account of rank i (1-based) has weight 1/i^skew.
		w.cdf = make([]float64, accounts)
		sum := 0.0
		for i := range w.cdf {
			sum += 1 / math.Pow(float64(i+1), skew)
			w.cdf[i] = sum
		}
		for i := range w.cdf {
			w.cdf[i] /= sum
		}
	}
	return w
}

// prefix starts the ID of each of the workload's accounts.
func (w *workload) prefix() string { return "b" + w.runID + "-" }

func (w *workload) pick(r *rand.Rand) string {
	if w.cdf == nil {
		return w.accounts[r.IntN(len(w.accounts))]
	}
	u := r.Float64()
	i := sort.SearchFloat64s(w.cdf, u)
	if i >= len(w.accounts) {
		i = len(w.accounts) - 1
	}
	return w.accounts[i]
}

// hot is the workload with every command on one account: the hottest one.
func (w *workload) hot() *workload {
	return &workload{runID: w.runID, accounts: w.accounts[:1], currency: w.currency, all: w.all, txRatio: w.txRatio}
}

// hottestShare is the share of commands that go to the most frequent account.
func (w *workload) hottestShare() float64 {
	if w.cdf == nil {
		return 1 / float64(len(w.accounts))
	}
	return w.cdf[0]
}

// command is one request to send.
type command struct {
	typ  domain.CommandType
	key  string
	body []byte
	dup  bool // a resend of a key already answered
}

func openBody(key, account, currency string) []byte {
	b := make([]byte, 0, 128)
	b = append(b, `{"idempotency_key":"`...)
	b = append(b, key...)
	b = append(b, `","account_id":"`...)
	b = append(b, account...)
	b = append(b, `","currency":"`...)
	b = append(b, currency...)
	b = append(b, `","overdraft_limit":`...)
	b = strconv.AppendInt(b, overdraftLimit, 10)
	return append(b, '}')
}

// transactionBody is a post_transaction of one posting, its ID its key.
func transactionBody(key, from, to string, amount int64, currency string) []byte {
	b := make([]byte, 0, 192)
	b = append(b, `{"idempotency_key":"`...)
	b = append(b, key...)
	b = append(b, `","transaction_id":"`...)
	b = append(b, key...)
	b = append(b, `","postings":[{"from":"`...)
	b = append(b, from...)
	b = append(b, `","to":"`...)
	b = append(b, to...)
	b = append(b, `","amount":`...)
	b = strconv.AppendInt(b, amount, 10)
	b = append(b, `,"currency":"`...)
	b = append(b, currency...)
	return append(b, `"}]}`...)
}

func moneyBody(key, account string, amount int64, currency string) []byte {
	b := make([]byte, 0, 128)
	b = append(b, `{"idempotency_key":"`...)
	b = append(b, key...)
	b = append(b, `","account_id":"`...)
	b = append(b, account...)
	b = append(b, `","amount":`...)
	b = strconv.AppendInt(b, amount, 10)
	b = append(b, `,"currency":"`...)
	b = append(b, currency...)
	return append(b, `"}`...)
}

// ringSize bounds the answered commands a client remembers for resending.
const ringSize = 4096

// clientGen is one client's generator: its own random source, key sequence and
// ring of answered commands.
type clientGen struct {
	w      *workload
	id     string
	r      *rand.Rand
	seq    int
	ring   []command
	ringAt int
	// resendDue accrues dupRatio per command; a resend is sent when it
	// reaches one half, and it then gives up one: the share of resends is
	// dupRatio over any run of commands, not only on average, so a short
	// phase has its resends too.
	resendDue float64
}

func newClientGen(w *workload, phase string, client int) *clientGen {
	return &clientGen{
		w:  w,
		id: w.runID + "-" + phase + "-" + strconv.Itoa(client),
		r:  rand.New(rand.NewPCG(uint64(client)+1, uint64(len(phase))*7919+uint64(phase[0]))),
	}
}

// next returns a new command, or, as dupRatio of the commands, a resend of a
// random one that was answered (when there is one).
func (g *clientGen) next(dupRatio float64) command {
	if dupRatio > 0 && len(g.ring) > 0 {
		g.resendDue += dupRatio
	}
	if g.resendDue >= 0.5 {
		g.resendDue--
		c := g.ring[g.r.IntN(len(g.ring))]
		c.dup = true
		return c
	}
	g.seq++
	key := g.id + "-" + strconv.Itoa(g.seq)
	acc := g.w.pick(g.r)
	amount := 1 + g.r.Int64N(1000)
	if g.w.txRatio > 0 && g.r.Float64() < g.w.txRatio {
		to := g.w.all[g.r.IntN(len(g.w.all))]
		for to == acc {
			to = g.w.all[g.r.IntN(len(g.w.all))]
		}
		return command{typ: domain.CmdPostTransaction, key: key, body: transactionBody(key, acc, to, amount, g.w.currency)}
	}
	typ := domain.CmdDeposit
	if g.r.IntN(2) == 1 {
		typ = domain.CmdWithdraw
	}
	return command{typ: typ, key: key, body: moneyBody(key, acc, amount, g.w.currency)}
}

// answered remembers a new command that got its outcome, for later resending.
func (g *clientGen) answered(c command) {
	if c.dup {
		return
	}
	if len(g.ring) < ringSize {
		g.ring = append(g.ring, c)
		return
	}
	g.ring[g.ringAt] = c
	g.ringAt = (g.ringAt + 1) % ringSize
}

// inherit gives g the answered commands of another generator (the duplicates
// phase resends what the load phase sent).
func (g *clientGen) inherit(from *clientGen) {
	g.ring = append(g.ring[:0], from.ring...)
}
