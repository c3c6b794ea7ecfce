package pgcopy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// fields splits a buffer of one tuple (after Tuple) into its fields' bytes.
func fields(t *testing.T, c *Buf) [][]byte {
	t.Helper()
	b := c.b[len(signature):]
	n := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	var out [][]byte
	for range n {
		l := int(binary.BigEndian.Uint32(b))
		out = append(out, b[4:4+l])
		b = b[4+l:]
	}
	if len(b) != 0 {
		t.Fatalf("%d bytes after the tuple's %d fields", len(b), n)
	}
	return out
}

// TestFieldsAsPgxWritesThem: each field's bytes are what pgx's binary
// encoding of the same Go value into the column's type writes (what the
// projections' loads sent through pgx's CopyFrom before).
func TestFieldsAsPgxWritesThem(t *testing.T) {
	m := pgtype.NewMap()
	at := []time.Time{
		time.Date(2026, 11, 28, 17, 2, 3, 123456789, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", -5*3600)),
		time.Date(1999, 1, 1, 0, 0, 0, 1000, time.UTC),
		{},
	}
	md := map[string]string{"b": "<2>", "a": "1 & \u00e9"}
	doc, err := json.Marshal(md)
	if err != nil {
		t.Fatal(err)
	}
	id := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	var c Buf
	c.Tuple(int16(4 + len(at))).Text("acc-\u00e9").Int8(-42).UUID(id).JSONB(doc)
	for _, ts := range at {
		c.Timestamptz(ts)
	}
	want := []struct {
		oid   uint32
		value any
	}{{pgtype.TextOID, "acc-\u00e9"}, {pgtype.Int8OID, int64(-42)}, {pgtype.UUIDOID, id}, {pgtype.JSONBOID, md}}
	for _, ts := range at {
		want = append(want, struct {
			oid   uint32
			value any
		}{pgtype.TimestamptzOID, ts})
	}
	got := fields(t, &c)
	for i, w := range want {
		p, err := m.Encode(w.oid, pgtype.BinaryFormatCode, w.value, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[i], p) {
			t.Errorf("field %d (%v): %x, pgx writes %x", i, w.value, got[i], p)
		}
	}
}

// TestEmptiedStartsAnotherCopy: an emptied buffer's next tuple opens a new
// COPY (the signature again), and Tuples counts the tuples since.
func TestEmptiedStartsAnotherCopy(t *testing.T) {
	var c Buf
	c.Tuple(1).Int8(1)
	c.Tuple(1).Int8(2)
	if c.Tuples() != 2 {
		t.Fatalf("%d tuples", c.Tuples())
	}
	c.Reader()
	c = c.Emptied()
	if c.Tuples() != 0 {
		t.Fatalf("%d tuples after Emptied", c.Tuples())
	}
	c.Tuple(1).Int8(3)
	if !bytes.HasPrefix(c.b, signature) || len(c.b) != len(signature)+2+4+8 {
		t.Fatalf("after Emptied: %x", c.b)
	}
}

// TestStreamWritesWhatBufWrites: a Stream's bytes, read in pgx's 64 KiB
// reads, are a Buf's of the same tuples (one COPY: one header, one
// trailer), while it holds about one piece of them at a time; a stream of
// no tuples is a header and a trailer; a row's error ends it.
func TestStreamWritesWhatBufWrites(t *testing.T) {
	row := func(c *Buf, i int) error {
		c.Text(fmt.Sprintf("account-%06d", i)).Int8(int64(i))
		return nil
	}
	for _, n := range []int{0, 1, 3000, 20000} {
		var want Buf
		if n == 0 {
			want.b = append(want.b, signature...)
		}
		for i := range n {
			_ = row(want.Tuple(2), i)
		}
		wantBytes, err := io.ReadAll(want.Reader())
		if err != nil {
			t.Fatal(err)
		}
		var c Buf
		r := Stream(&c, 2, n, row)
		got, most := readPieces(t, r, &c)
		if !bytes.Equal(got, wantBytes) {
			t.Errorf("%d tuples: the stream wrote %d bytes, not the %d a Buf writes", n, len(got), len(wantBytes))
		}
		if most > StreamPieceBytes+64 {
			t.Errorf("%d tuples: the stream held %d bytes at once", n, most)
		}
	}
	boom := errors.New("boom")
	var c Buf
	r := Stream(&c, 1, 100000, func(c *Buf, i int) error {
		if i == 50000 {
			return boom
		}
		c.Int8(int64(i))
		return nil
	})
	if _, err := io.ReadAll(r); !errors.Is(err, boom) || !errors.Is(r.Err(), boom) {
		t.Fatalf("a row's error: read %v, Err %v", err, r.Err())
	}
}

// readPieces reads r to its end 64 KiB at a time, as pgx's CopyFrom does,
// and returns what it read and the most c held meanwhile.
func readPieces(t *testing.T, r io.Reader, c *Buf) (read []byte, most int) {
	t.Helper()
	p := make([]byte, 65531)
	for {
		n, err := r.Read(p)
		read = append(read, p[:n]...)
		most = max(most, len(c.b))
		if err == io.EOF {
			return read, most
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestStreamAfterAnErrorHandsOutNoByte: once a row failed, every later Read returns the
// error and no byte (an io.Reader that returned an error hands out no
// half-written tuple after it).
func TestStreamAfterAnErrorHandsOutNoByte(t *testing.T) {
	boom := errors.New("boom")
	var c Buf
	r := Stream(&c, 2, 10, func(c *Buf, i int) error {
		c.Int8(int64(i))
		if i == 5 {
			return boom // after writing a field: the tuple is half written
		}
		c.Int8(int64(i))
		return nil
	})
	p := make([]byte, 1<<16)
	n, err := r.Read(p)
	if n != 0 || !errors.Is(err, boom) {
		t.Fatalf("first read: %d bytes, %v", n, err)
	}
	n, err = r.Read(p)
	if n != 0 || err == nil {
		t.Errorf("read after the error: %d bytes (%x), err %v", n, p[:n], err)
	}
}

// TestCloseWaitsForTheReadUnderWay: Close returns only once a Read under way
// (its rows being written into c, by another goroutine, as pgconn's CopyFrom
// reads) has returned, and after it no row is written and a Read hands out
// nothing: its caller may then reuse c (copyOrUpsert puts it back in its
// pool for the next COPY).
func TestCloseWaitsForTheReadUnderWay(t *testing.T) {
	var (
		c                    Buf
		entered, release     = make(chan struct{}), make(chan struct{})
		rows                 atomic.Int64
		closed, rowAfterShut atomic.Bool
	)
	r := Stream(&c, 1, 1000, func(c *Buf, i int) error {
		rows.Add(1)
		if i == 0 {
			close(entered)
			<-release
		}
		if closed.Load() {
			rowAfterShut.Store(true)
		}
		c.Int8(int64(i))
		return nil
	})
	readErr := make(chan error, 1)
	go func() { _, err := r.Read(make([]byte, 16)); readErr <- err }()
	<-entered
	closeDone := make(chan struct{})
	go func() { r.Close(); closed.Store(true); close(closeDone) }()
	devtest.Eventually(t, 10*time.Second, "Close neither returned nor waited for the Read under way", func() bool {
		return closed.Load() || waitingIn("pgcopy.(*StreamReader).Close", "sync.(*Mutex).Lock")
	})
	close(release)
	<-closeDone
	if err := <-readErr; err != nil {
		t.Fatalf("the Read under way: %v", err)
	}
	if rowAfterShut.Load() {
		t.Fatal("Close returned while a Read under way was still writing rows into its Buf")
	}
	written := rows.Load()
	if n, err := r.Read(make([]byte, 16)); n != 0 || !errors.Is(err, ErrStreamClosed) {
		t.Fatalf("a Read after Close: %d bytes, %v; want %v", n, err, ErrStreamClosed)
	}
	if rows.Load() != written {
		t.Fatalf("%d rows written after Close", rows.Load()-written)
	}
}

// waitingIn reports whether a goroutine's stack holds both frames (the
// first calling the second).
func waitingIn(caller, callee string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if i := bytes.Index(g, []byte(callee)); i >= 0 && bytes.Contains(g[i:], []byte(caller)) {
			return true
		}
	}
	return false
}

// TestNullIsALengthOfMinusOne: a NULL field is its length, -1, and no bytes
// (COPY's binary format), between the fields around it.
func TestNullIsALengthOfMinusOne(t *testing.T) {
	var c Buf
	c.Tuple(3).Int8(7).Null().Text("x")
	want := []byte{0, 3, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 'x'}
	if got := c.b[len(signature):]; !bytes.Equal(got, want) {
		t.Fatalf("a tuple with a NULL: % x, want % x", got, want)
	}
}

// TestTuplesOfPagesWrittenAsideAreOneBufs: pages of tuples written aside
// (WriteTuplesTo, an empty page among them) and read back as one COPY
// (Tuples) are the bytes of one Buf holding every tuple.
func TestTuplesOfPagesWrittenAsideAreOneBufs(t *testing.T) {
	var whole, page Buf
	var aside bytes.Buffer
	for p, rows := range [][]int64{{1, 2}, {}, {3}} {
		for _, v := range rows {
			whole.Tuple(2).Int8(v).Text("x")
			page.Tuple(2).Int8(v).Text("x")
		}
		if err := page.WriteTuplesTo(&aside); err != nil {
			t.Fatalf("page %d: %v", p, err)
		}
		page = page.Emptied()
	}
	got, err := io.ReadAll(Tuples(&aside))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := io.ReadAll(whole.Reader())
	if !bytes.Equal(got, want) {
		t.Fatalf("pages written aside:\n%x\none Buf:\n%x", got, want)
	}
}
