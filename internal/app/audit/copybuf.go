package audit

import (
	"bytes"
	"encoding/binary"
	"io"
)

// copyBuf is a page's rows of one of the sets' tables in COPY's binary format
// (PostgreSQL's "COPY ... FROM STDIN (FORMAT binary)": a header, each tuple
// its field count and each field its length and bytes in the type's binary
// form, a trailer), appended as the fold notes them. pgx's CopyFrom took
// each row as a []any and looked up an encode plan for each value (8% of the
// audit's CPU at 1,000,000 events, with the boxing of the values besides);
// the sets' columns are of four types whose binary forms are plain: text and
// bytea their bytes, bigint 8 bytes big-endian, uuid its 16 bytes.
type copyBuf struct {
	b []byte
	n int // tuples
}

// copySignature opens a binary COPY: the signature, the flags field and the
// header extension's length (both 0).
var copySignature = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

// tuple starts a tuple of fields fields.
func (c *copyBuf) tuple(fields int16) *copyBuf {
	if c.n == 0 {
		c.b = append(c.b[:0], copySignature...)
	}
	c.n++
	c.b = binary.BigEndian.AppendUint16(c.b, uint16(fields))
	return c
}

func (c *copyBuf) text(s string) *copyBuf {
	c.b = binary.BigEndian.AppendUint32(c.b, uint32(len(s)))
	c.b = append(c.b, s...)
	return c
}

func (c *copyBuf) bytes(b []byte) *copyBuf {
	c.b = binary.BigEndian.AppendUint32(c.b, uint32(len(b)))
	c.b = append(c.b, b...)
	return c
}

func (c *copyBuf) int8(v int64) *copyBuf {
	c.b = binary.BigEndian.AppendUint32(c.b, 8)
	c.b = binary.BigEndian.AppendUint64(c.b, uint64(v))
	return c
}

func (c *copyBuf) uuid(id [16]byte) *copyBuf {
	c.b = binary.BigEndian.AppendUint32(c.b, 16)
	c.b = append(c.b, id[:]...)
	return c
}

// reader ends the COPY's data (its trailer) and reads it.
func (c *copyBuf) reader() io.Reader {
	c.b = binary.BigEndian.AppendUint16(c.b, 0xffff)
	return bytes.NewReader(c.b)
}

// emptied returns the buffer emptied, its array kept.
func (c copyBuf) emptied() copyBuf { return copyBuf{b: c.b[:0]} }
