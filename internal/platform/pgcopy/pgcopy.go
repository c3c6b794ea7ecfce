// Package pgcopy writes rows in the binary format of PostgreSQL's COPY (COPY
// ... FROM STDIN (FORMAT binary)) into one buffer: the audit's sets and the
// projections' loads. pgx's CopyFrom takes each row as a []any and looks up an
// encode plan for each value (8% of the audit's CPU at 1,000,000 events, and
// 6% of a rebuild's, with the boxing of the values besides: a rebuild's third
// largest allocation by bytes); the columns written here are of types whose
// binary forms are plain, written as pgx writes them.
package pgcopy

import (
	"bytes"
	"encoding/binary"
	"io"
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
	c.b = binary.BigEndian.AppendUint16(c.b, 0xffff)
	return bytes.NewReader(c.b)
}

// Emptied returns the buffer emptied, its array kept.
func (c Buf) Emptied() Buf { return Buf{b: c.b[:0]} }
