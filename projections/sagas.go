package projections

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// The reply of a transfer or of a refund of a transfer is written when its saga is
// decided, and it gathers events from several streams: the saga's events in the
// transfer stream and the records of its steps (debit, credit, compensation) in
// account streams, which arrive earlier in "all". Until the decision, the commands
// projection keeps these parts in readmodel.command_parts:
//
//	transfer/<id>  the transfer stream's last applied revision and its own saga's stage
//	saga/<key>     a saga's events so far and its stage
//	step/<key>     a step's record: its events and the account right after it
//
// The reply is assembled as the ledger assembles it (internal/app/ledger sagaReply).

type part struct {
	revision int64
	// step and saga
	Status domain.Status       `json:"status,omitempty"`
	Events []domain.EventRef   `json:"events,omitempty"`
	After  *domain.AccountView `json:"after,omitempty"`
	// saga
	TransferID string           `json:"transfer_id,omitempty"`
	Command    string           `json:"command,omitempty"`
	Refund     bool             `json:"refund,omitempty"`
	Outright   bool             `json:"outright,omitempty"`
	Stage      domain.SagaStage `json:"stage,omitempty"`
	Code       domain.Code      `json:"code,omitempty"`
	Message    string           `json:"message,omitempty"`
	Position   string           `json:"position,omitempty"`
	FirstRev   int64            `json:"first_revision,omitempty"`
	At         time.Time        `json:"at,omitzero"`
	// transfer: its own saga's key (Stage is the transfer's stage)
	SagaKey string `json:"saga_key,omitempty"`
	// saga of a transfer with up_to (v1.2 §2.3): UpTo, and once completed
	// what it moved
	UpTo  bool   `json:"up_to,omitempty"`
	Moved *int64 `json:"moved,omitempty"`
}

type cmdParts struct {
	m       map[string]*part
	dirty   map[string]bool
	deleted map[string]bool
}

// sagaStep reports whether an account event was written by a step of a transfer saga.
func sagaStep(m domain.Metadata) bool {
	if m.Origin == "" {
		return false
	}
	switch domain.CommandType(m.Command) {
	case domain.CmdTransferDebit, domain.CmdTransferCredit, domain.CmdTransferCompensate:
		return true
	}
	return false
}

// sagaKeyOf names the saga a transfer-stream event belongs to.
func sagaKeyOf(ev *Event) string {
	switch p := ev.Payload.(type) {
	case *domain.TransferRefundRequested:
		return p.RefundKey
	case *domain.RefundRejected:
		return p.RefundKey
	case *domain.RefundCreditRefused:
		return p.RefundKey
	case *domain.RefundCompleted:
		return p.RefundKey
	case *domain.RefundFailed:
		return p.RefundKey
	}
	if ev.Meta.Origin != "" {
		return ev.Meta.Origin
	}
	return ev.Meta.Key
}

func loadParts(ctx context.Context, tx pgx.Tx, gen int, events []*Event) (*cmdParts, error) {
	ps := &cmdParts{m: map[string]*part{}, dirty: map[string]bool{}, deleted: map[string]bool{}}
	seen := map[string]bool{}
	var keys []string
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	for _, ev := range events {
		if _, ok := ev.AccountID(); ok {
			if sagaStep(ev.Meta) {
				add("step/" + ev.Meta.Key)
			}
			continue
		}
		id, ok := strings.CutPrefix(ev.Stream, domain.TransferStreamPrefix)
		if !ok || ev.DecodeErr != nil {
			continue
		}
		add("transfer/" + id)
		sk := sagaKeyOf(ev)
		add("saga/" + sk)
		for _, step := range []string{domain.StepDebit, domain.StepCredit, domain.StepCompensate} {
			add("step/" + domain.StepKey(sk, step))
		}
	}
	if len(keys) == 0 {
		return ps, nil
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT key, revision, data::text FROM %s WHERE key = ANY($1)`, Table("command_parts", gen)), keys)
	if err != nil {
		return nil, fmt.Errorf("projections: commands: %w", err)
	}
	var (
		key, data string
		rev       int64
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &rev, &data}, func() error {
		p := &part{}
		if err := json.Unmarshal([]byte(data), p); err != nil {
			return fmt.Errorf("part %q: %w", key, err)
		}
		p.revision = rev
		ps.m[key] = p
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projections: commands: %w", err)
	}
	return ps, nil
}

func (ps *cmdParts) touch(key string) { ps.dirty[key] = true; delete(ps.deleted, key) }

// step records a saga step's event in an account stream.
func (ps *cmdParts) step(ev *Event, view *domain.AccountView) {
	key := "step/" + ev.Meta.Key
	p := ps.m[key]
	if p == nil || ev.Meta.Index == 0 {
		p = &part{Status: domain.StatusApplied}
		ps.m[key] = p
	}
	p.Events = append(p.Events, domain.EventRef{ID: ev.ID, Stream: ev.Stream, Revision: ev.Revision, Type: ev.Type})
	if _, ok := ev.Payload.(*domain.CommandRejected); ok {
		p.Status = domain.StatusRejected
	}
	p.After = view
	p.revision = int64(ev.Revision)
	ps.touch(key)
}

// transferEvent applies an event of a transfer stream; a saga it decides gets its
// reply row through decided.
func (ps *cmdParts) transferEvent(ev *Event, decided func(*cmdRow)) error {
	id := strings.TrimPrefix(ev.Stream, domain.TransferStreamPrefix)
	tp, ok := ps.transferRevision(id, ev)
	if !ok {
		return nil // applied by an earlier batch
	}
	sk := sagaKeyOf(ev)
	skey := "saga/" + sk // its part's key, made once for the event
	s, err := ps.sagaStage(ev, id, skey, tp)
	if err != nil {
		return err
	}
	s.Events = append(s.Events, domain.EventRef{ID: ev.ID, Stream: ev.Stream, Revision: ev.Revision, Type: ev.Type})
	s.Position = ev.Position.String()
	s.revision = int64(ev.Revision)
	ps.touch(skey)
	if !s.Refund {
		tp.Stage = s.Stage
	}
	if !s.Stage.Decided() {
		return nil
	}
	decided(&cmdRow{
		key: sk, stream: ev.Stream, command: s.Command, reset: true, firstRev: s.FirstRev, lastRev: int64(ev.Revision), at: s.At,
		reply: ps.reply(sk, s, tp.Stage.Status()),
	})
	ps.dropDecided(skey)
	return nil
}

// transferRevision advances transfer id's part to ev's revision and returns
// it; false means an earlier batch applied ev already.
func (ps *cmdParts) transferRevision(id string, ev *Event) (*part, bool) {
	tkey := "transfer/" + id
	tp := ps.m[tkey]
	if tp == nil {
		tp = &part{revision: -1}
		ps.m[tkey] = tp
	}
	if int64(ev.Revision) <= tp.revision {
		return nil, false
	}
	tp.revision = int64(ev.Revision)
	ps.touch(tkey)
	return tp, true
}

// sagaStage applies a transfer-stream event to the stage of its saga, whose
// part's key is skey ("saga/" and the saga's key), of transfer id whose part
// is tp: a request starts the saga's part, a later event moves its stage and
// must follow a part. It returns the saga's part.
func (ps *cmdParts) sagaStage(ev *Event, id, skey string, tp *part) (*part, error) {
	m := ev.Meta
	sk := strings.TrimPrefix(skey, "saga/")
	s := ps.m[skey]
	newSaga := func(refund bool) *part {
		s = &part{TransferID: id, Command: m.Command, Refund: refund, Stage: domain.SagaPending, FirstRev: int64(ev.Revision), At: m.At}
		ps.m[skey] = s
		return s
	}
	advance := func(to domain.SagaStage, code domain.Code, msg string) error {
		if s == nil {
			return fmt.Errorf("projections: commands: %s@%d: %s does not follow its saga %q", ev.Stream, ev.Revision, ev.Type, sk)
		}
		s.Stage, s.Code, s.Message = to, code, msg
		return nil
	}
	var err error
	switch p := ev.Payload.(type) {
	case *domain.TransferRequested:
		newSaga(false).UpTo = p.UpTo
		tp.SagaKey = sk
	case *domain.TransferRejected:
		if s != nil && m.Key == sk {
			s.Outright = true
		}
		err = advance(domain.SagaRejected, p.Code, p.Message)
	case *domain.TransferCreditRefused:
		err = advance(domain.SagaCompensating, p.Code, p.Message)
	case *domain.TransferCompleted:
		if err = advance(domain.SagaCompleted, domain.CodeOK, ""); err == nil && s.UpTo {
			s.Moved = &p.Amount
		}
	case *domain.TransferFailed:
		err = advance(domain.SagaFailed, p.Code, p.Message)
	case *domain.TransferRefundRequested:
		newSaga(true)
	case *domain.RefundRejected:
		if s == nil {
			newSaga(true).Outright = true
		}
		err = advance(domain.SagaRejected, p.Code, p.Message)
	case *domain.RefundCreditRefused:
		err = advance(domain.SagaCompensating, p.Code, p.Message)
	case *domain.RefundCompleted:
		err = advance(domain.SagaCompleted, domain.CodeOK, "")
	case *domain.RefundFailed:
		err = advance(domain.SagaFailed, p.Code, p.Message)
	default:
		return nil, fmt.Errorf("projections: commands: %s@%d: event %s does not belong to a transfer stream", ev.Stream, ev.Revision, ev.Type)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// dropDecided marks the parts of a decided saga, whose part's key is skey
// (the saga's and its steps'), for deletion: its reply row holds them now.
func (ps *cmdParts) dropDecided(skey string) {
	sk := strings.TrimPrefix(skey, "saga/")
	for _, k := range []string{skey, "step/" + domain.StepKey(sk, domain.StepDebit), "step/" + domain.StepKey(sk, domain.StepCredit), "step/" + domain.StepKey(sk, domain.StepCompensate)} {
		delete(ps.dirty, k)
		ps.deleted[k] = true
	}
}

// reply is a decided saga's reply (reply.FromSaga), its steps read from the parts.
func (ps *cmdParts) reply(sk string, s *part, transferStatus string) reply.Reply {
	sg := reply.Saga{
		Key: sk, TransferID: s.TransferID, TransferStatus: transferStatus, Stage: s.Stage, Code: s.Code, Message: s.Message,
		Outright: s.Outright, Events: s.Events, Position: s.Position, Moved: s.Moved,
	}
	r, _ := reply.FromSaga(sg, false, func(_, stepKey string) (*reply.Step, error) {
		p := ps.m["step/"+stepKey]
		if p == nil {
			return nil, nil
		}
		return &reply.Step{Status: p.Status, Events: p.Events, After: p.After}, nil
	})
	return r
}

func (ps *cmdParts) write(ctx context.Context, tx pgx.Tx, gen int) error {
	t := Table("command_parts", gen)
	if len(ps.dirty) > 0 {
		keys := make([]string, 0, len(ps.dirty))
		for k := range ps.dirty {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		revs := make([]int64, len(keys))
		data := make([]string, len(keys))
		for i, k := range keys {
			b, err := json.Marshal(ps.m[k])
			if err != nil {
				return fmt.Errorf("projections: commands: %w", err)
			}
			revs[i], data[i] = ps.m[k].revision, string(b)
		}
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s AS p (key, revision, data)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::json[])
ON CONFLICT (key) DO UPDATE SET revision = excluded.revision, data = excluded.data WHERE p.revision < excluded.revision`, t), keys, revs, data)
		if err != nil {
			return fmt.Errorf("projections: commands: parts: %w", err)
		}
	}
	if len(ps.deleted) > 0 {
		keys := make([]string, 0, len(ps.deleted))
		for k := range ps.deleted {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if _, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE key = ANY($1)`, t), keys); err != nil {
			return fmt.Errorf("projections: commands: parts: %w", err)
		}
	}
	return nil
}
