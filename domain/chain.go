package domain

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// ChainHash links an event to the previous event of its stream (prev is "" for the
// first): SHA-256 over prev, the event's ID, stream, revision, type, data, key and
// request hash, each length-prefixed. Changing any stored byte of an event, or
// removing or reordering one, breaks the chain from that event on.
func ChainHash(prev string, ev StoredEvent) string {
	h := sha256.New()
	field := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	var rev [8]byte
	binary.BigEndian.PutUint64(rev[:], ev.Revision)
	field([]byte(prev))
	field(ev.ID[:])
	field([]byte(ev.Stream))
	field(rev[:])
	field([]byte(ev.Type))
	field(ev.Data)
	field([]byte(ev.Metadata.Key))
	field([]byte(ev.Metadata.RequestHash))
	return hex.EncodeToString(h.Sum(nil))
}
