package domain

import (
	"encoding/binary"
)

// ChainHash links an event to the previous event of its stream (prev is "" for the
// first): SHA-256 over prev, the event's ID, stream, revision, type, data, key and
// request hash, each length-prefixed. Changing any stored byte of an event, or
// removing or reordering one, breaks the chain from that event on.
func ChainHash(prev string, ev StoredEvent) string {
	var rev [8]byte
	binary.BigEndian.PutUint64(rev[:], ev.Revision)
	var stack [1024]byte
	b := stack[:0]
	field := func(p []byte) {
		b = binary.BigEndian.AppendUint64(b, uint64(len(p)))
		b = append(b, p...)
	}
	fieldString := func(s string) {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	fieldString(prev)
	field(ev.ID[:])
	fieldString(ev.Stream)
	field(rev[:])
	fieldString(ev.Type)
	field(ev.Data)
	fieldString(ev.Metadata.Key)
	fieldString(ev.Metadata.RequestHash)
	return hexSHA256(b)
}
