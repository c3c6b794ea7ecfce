package postgres

import (
	"encoding/binary"
	"slices"

	"github.com/jackc/pgx/v5/pgtype"
)

// The insert's arrays (insertArgs), encoded in PostgreSQL's binary array format
// in one pass, into a buffer grown at most once for each. pgx's own array encoding
// boxes every element in an interface (an allocation per string, ID and
// revision) and appends to a buffer that starts at 256 bytes and grows by
// 1.25x, so that a group commit of a few hundred events allocated about five
// times its data and copied it four times (issue 24, BENCHMARKS.md). The wire
// form is the same: what PostgreSQL receives does not change.
type (
	textArray  []string
	int8Array  []int64
	uuidArray  [][16]byte
	byteaArray [][]byte
)

// binaryArray is one of the insert's arrays: one dimension, no NULL element.
type binaryArray interface {
	elementOID() uint32
	length() int
	dataBytes() int // the elements' bytes, without their length words
	appendElement(buf []byte, i int) []byte
}

func (a textArray) elementOID() uint32                     { return pgtype.TextOID }
func (a textArray) length() int                            { return len(a) }
func (a textArray) dataBytes() int                         { return totalLen(a) }
func (a textArray) appendElement(buf []byte, i int) []byte { return append(buf, a[i]...) }

func (a int8Array) elementOID() uint32 { return pgtype.Int8OID }
func (a int8Array) length() int        { return len(a) }
func (a int8Array) dataBytes() int     { return 8 * len(a) }
func (a int8Array) appendElement(buf []byte, i int) []byte {
	return binary.BigEndian.AppendUint64(buf, uint64(a[i]))
}

func (a uuidArray) elementOID() uint32                     { return pgtype.UUIDOID }
func (a uuidArray) length() int                            { return len(a) }
func (a uuidArray) dataBytes() int                         { return 16 * len(a) }
func (a uuidArray) appendElement(buf []byte, i int) []byte { return append(buf, a[i][:]...) }

func (a byteaArray) elementOID() uint32 { return pgtype.ByteaOID }
func (a byteaArray) length() int        { return len(a) }
func (a byteaArray) dataBytes() int     { return totalLen(a) }

// totalLen is the bytes of a's elements.
func totalLen[E string | []byte](a []E) (n int) {
	for _, e := range a {
		n += len(e)
	}
	return n
}
func (a byteaArray) appendElement(buf []byte, i int) []byte { return append(buf, a[i]...) }

// encodeArray appends a in PostgreSQL's binary array format (array_recv): the
// number of dimensions, a has-NULL flag, the element type, each dimension's
// length and lower bound, then each element as its length and its bytes.
func encodeArray(a binaryArray, buf []byte) []byte {
	n := a.length()
	if need := 20 + 4*n + a.dataBytes(); cap(buf)-len(buf) < need {
		// pgx encodes the insert's seven arrays one after another into one
		// buffer: grown to twice what it then holds, the next ones (as large)
		// fit without copying the first again.
		buf = slices.Grow(buf, len(buf)+2*need)
	}
	buf = binary.BigEndian.AppendUint32(buf, 1) // one dimension, even when empty (as pgx)
	buf = binary.BigEndian.AppendUint32(buf, 0) // no NULL
	buf = binary.BigEndian.AppendUint32(buf, a.elementOID())
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	buf = binary.BigEndian.AppendUint32(buf, 1) // lower bound
	for i := range n {
		at := len(buf)
		buf = append(buf, 0, 0, 0, 0)
		buf = a.appendElement(buf, i)
		binary.BigEndian.PutUint32(buf[at:], uint32(len(buf)-at-4))
	}
	return buf
}

type arrayPlan struct{}

func (arrayPlan) Encode(value any, buf []byte) ([]byte, error) {
	return encodeArray(value.(binaryArray), buf), nil
}

// arrayCodec stands in front of the codec registered for an array type: it
// encodes the insert's arrays itself, in binary, and leaves every other value
// and every scan to the codec it wraps.
type arrayCodec struct{ pgtype.Codec }

func (c arrayCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if a, ok := value.(binaryArray); ok && format == pgtype.BinaryFormatCode && arrayOIDs[a.elementOID()] == oid {
		return arrayPlan{}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

// arrayOIDs maps the insert's element types to their array types.
var arrayOIDs = map[uint32]uint32{
	pgtype.TextOID:  pgtype.TextArrayOID,
	pgtype.Int8OID:  pgtype.Int8ArrayOID,
	pgtype.UUIDOID:  pgtype.UUIDArrayOID,
	pgtype.ByteaOID: pgtype.ByteaArrayOID,
}

// registerArrays puts arrayCodec in front of the array types of m, a
// connection's type map, once; an append calls it before its insert.
func registerArrays(m *pgtype.Map) {
	if t, ok := m.TypeForOID(pgtype.ByteaArrayOID); ok {
		if _, done := t.Codec.(arrayCodec); done {
			return
		}
	}
	for _, oid := range arrayOIDs {
		if t, ok := m.TypeForOID(oid); ok {
			m.RegisterType(&pgtype.Type{Name: t.Name, OID: oid, Codec: arrayCodec{t.Codec}})
		}
	}
}
