// Package pgcopy writes rows in the binary format of PostgreSQL's COPY (COPY
// ... FROM STDIN (FORMAT binary)): into one buffer (Buf: the audit's sets), or
// streamed in pieces as COPY reads them (Stream: the projections' loads). pgx's CopyFrom takes each row as a []any and looks up an
// encode plan for each value (8% of the audit's CPU at 1,000,000 events, and
// 6% of a rebuild's, with the boxing of the values besides: a rebuild's third
// largest allocation by bytes); the columns written here are of types whose
// binary forms are plain, written as pgx writes them.
package pgcopy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"time"
)

// Buf is rows in COPY's binary format: a header, each tuple its field count
// and each field its length and bytes in the type's binary form, a trailer
// (Reader). The zero Buf is empty.
type Buf struct {
	b []byte
	n int // tuples
}

// signature opens a binary COPY: the signature, the flags field and the
// header extension's length (both 0).
var signature = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

// Tuple starts a tuple of fields fields.
func (c *Buf) Tuple(fields int16) *Buf {
	if c.n == 0 {
		c.b = append(c.b[:0], signature...)
	}
	c.n++
	c.b = binary.BigEndian.AppendUint16(c.b, uint16(fields))
	return c
}

// Tuples is the number of tuples in the buffer.
func (c *Buf) Tuples() int { return c.n }

// Text is a text field (or varchar): its bytes.
func (c *Buf) Text(s string) *Buf {
	c.b = binary.BigEndian.AppendUint32(c.b, uint32(len(s)))
	c.b = append(c.b, s...)
	return c
}

// Bytes is a bytea field (or json: its text): its bytes.
func (c *Buf) Bytes(b []byte) *Buf {
	c.b = binary.BigEndian.AppendUint32(c.b, uint32(len(b)))
	c.b = append(c.b, b...)
	return c
}

// JSONB is a jsonb field of the document doc: version 1, then its text.
func (c *Buf) JSONB(doc []byte) *Buf {
	c.b = binary.BigEndian.AppendUint32(c.b, uint32(len(doc)+1))
	c.b = append(c.b, 1)
	c.b = append(c.b, doc...)
	return c
}

// Null is a NULL field of any type: a length of -1 and no bytes.
func (c *Buf) Null() *Buf {
	c.b = binary.BigEndian.AppendUint32(c.b, 0xffffffff)
	return c
}

// Int8 is a bigint field: 8 bytes big-endian.
func (c *Buf) Int8(v int64) *Buf {
	c.b = binary.BigEndian.AppendUint32(c.b, 8)
	c.b = binary.BigEndian.AppendUint64(c.b, uint64(v))
	return c
}

// UUID is a uuid field: its 16 bytes.
func (c *Buf) UUID(id [16]byte) *Buf {
	c.b = binary.BigEndian.AppendUint32(c.b, 16)
	c.b = append(c.b, id[:]...)
	return c
}

// microsY2K is the microseconds from the Unix epoch to 2000-01-01 UTC, where
// PostgreSQL's timestamps count from.
const microsY2K = 946_684_800 * 1_000_000

// Timestamptz is a timestamptz field: the microseconds since 2000-01-01 UTC,
// 8 bytes big-endian, the nanoseconds truncated as pgx truncates them.
func (c *Buf) Timestamptz(t time.Time) *Buf {
	return c.Int8(t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - microsY2K)
}

// Reader ends the COPY's data (its trailer) and reads it.
func (c *Buf) Reader() io.Reader {
	c.end()
	return bytes.NewReader(c.b)
}

// WriteTuplesTo writes the tuples alone, without the header and trailer, to
// w: pages of rows kept aside (a file), to be copied later as one COPY
// (Tuples).
func (c *Buf) WriteTuplesTo(w io.Writer) error {
	if c.n == 0 {
		return nil
	}
	_, err := w.Write(c.b[len(signature):])
	return err
}

// Tuples is a COPY's whole binary stream of the tuples read from r, as
// WriteTuplesTo wrote them: the header, r, the trailer.
func Tuples(r io.Reader) io.Reader {
	return io.MultiReader(bytes.NewReader(signature), r, bytes.NewReader(trailer))
}

// trailer ends the COPY's data: a field count of -1.
var trailer = []byte{0xff, 0xff}

// end writes the trailer.
func (c *Buf) end() { c.b = append(c.b, trailer...) }

// Emptied returns the buffer emptied, its array kept.
func (c Buf) Emptied() Buf { return Buf{b: c.b[:0]} }

// StreamPieceBytes is about the most a Stream holds of its COPY's data at
// once: the size of the pieces pgx's CopyFrom sends (64 KiB), plus one row.
const StreamPieceBytes = 64 << 10

// Stream returns n tuples of fields fields in COPY's binary format, a header
// before them and the trailer after, written into c as they are read, a piece
// of about StreamPieceBytes at a time: a COPY of thousands of rows holds one
// piece, not all of them (c's array is reused for each; its tuples are lost).
// row(c, i) writes the i-th tuple's fields, after Stream has started it. A
// row's error ends the reading with it (Err).
func Stream(c *Buf, fields int16, n int, row func(c *Buf, i int) error) *StreamReader {
	*c = c.Emptied()
	return &StreamReader{c: c, fields: fields, n: n, row: row}
}

// StreamReader is a Stream being read. Its reader may be another goroutine
// (pgconn's CopyFrom reads in one, and returns without waiting for it when
// the connection fails): Close, before c is used again, waits for a Read
// under way and ends the reading.
type StreamReader struct {
	mu     sync.Mutex
	c      *Buf
	fields int16
	n, i   int
	row    func(c *Buf, i int) error
	off    int  // read of c.b
	ended  bool // the trailer is in c.b
	err    error
	closed bool
}

// ErrStreamClosed is what a Read of a closed StreamReader returns.
var ErrStreamClosed = errors.New("pgcopy: stream closed")

// Read hands out the next bytes of the COPY's data. After a row's error
// every Read returns it, and no byte (the piece under way is half written).
func (r *StreamReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return 0, ErrStreamClosed
	case r.err != nil:
		return 0, r.err
	case r.off == len(r.c.b) && r.ended:
		return 0, io.EOF
	case r.off == len(r.c.b):
		if r.err = r.fill(); r.err != nil {
			return 0, r.err
		}
	}
	n := copy(p, r.c.b[r.off:])
	r.off += n
	return n, nil
}

// Close ends the reading, once a Read under way has returned: after it no
// row is written into c, which its caller may then reuse.
func (r *StreamReader) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
}

// fill writes the next piece of tuples into c, from its start, and the
// trailer after the last (a stream of none is its header and trailer).
func (r *StreamReader) fill() error {
	r.c.b, r.off = r.c.b[:0], 0
	if r.n == 0 {
		r.c.b = append(r.c.b, signature...)
	}
	for r.i < r.n && len(r.c.b) < StreamPieceBytes {
		if err := r.row(r.c.Tuple(r.fields), r.i); err != nil {
			return err
		}
		r.i++
	}
	if r.i == r.n {
		r.c.end()
		r.ended = true
	}
	return nil
}

// Err is the error of a row that ended the reading (nil: none).
func (r *StreamReader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}
