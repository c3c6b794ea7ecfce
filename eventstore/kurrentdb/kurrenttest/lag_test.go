package kurrenttest_test

import (
	"testing"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"google.golang.org/grpc/metadata"

	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
)

// TestReadLag: with SetReadLag(2) stream reads, $all reads and subscriptions
// see the log without its last 2 records, appends are decided on all of it,
// and a call with requires-leader: true reads everything. (SetReadLag is new
// with issue 26: before, every read saw every committed record.)
func TestReadLag(t *testing.T) {
	s, _ := kurrenttest.Start(t, kurrenttest.WithEmptyLog())
	c := client(t, s)
	rc := raw(t, s)
	s.SetReadLag(2)
	mustAppend(t, c, "s", esdb.NoStream{}, ids(3)...)
	equal(t, readKinds(t, rc, "s"), []string{"event:s/0"})
	if r := rawAppend(t, rc, "s", expRev(2), ids(1)...).GetSuccess(); r == nil || r.GetCurrentRevision() != 3 {
		t.Fatalf("append at the leader's head: %+v", r)
	}
	var all []string
	for _, m := range readAllRaw(t, mustRead(t, rc, allReadReq(allStart(), 10))) {
		all = append(all, kind(m))
	}
	equal(t, all, []string{"event:s/0", "event:s/1"})
	leader := metadata.AppendToOutgoingContext(ctxT(t), "requires-leader", "true")
	rs, err := rc.Read(leader, streamReadReq("s", 0, false, 10))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range readAllRaw(t, rs) {
		got = append(got, kind(m))
	}
	equal(t, got, []string{"event:s/0", "event:s/1", "event:s/2", "event:s/3"})

	sub, err := c.SubscribeToStream(ctxT(t), "s", esdb.SubscribeToStreamOptions{From: esdb.Start{}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for want := range uint64(2) {
		if ev := sub.Recv(); ev.EventAppeared == nil || ev.EventAppeared.OriginalEvent().EventNumber != want {
			t.Fatalf("subscription: %+v, want event %d", ev, want)
		}
	}
	mustAppend(t, c, "s", esdb.Revision(3), ids(1)...)
	for ev := sub.Recv(); ev.EventAppeared == nil || ev.EventAppeared.OriginalEvent().EventNumber != 2; ev = sub.Recv() {
		if ev.EventAppeared != nil || ev.SubscriptionDropped != nil {
			t.Fatalf("subscription after a fifth append: %+v, want event 2", ev)
		}
	}
}
