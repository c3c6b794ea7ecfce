package pgcopy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
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
