package kurrenttest

import "github.com/google/uuid"

// systemRecord is one record of the kinds a fresh node writes to its log before
// any client does: stream metadata, settings, the default users.
type systemRecord struct{ stream, eventType, data string }

// freshLog is what $all holds before the first client write. A real log starts
// with epoch and system records; their exact set and sizes vary by release and
// configuration, and the ledger must skip every one of them. The settings
// record uses a type without "$", as an operator's ACL update does: only its
// stream marks it as a system record.
var freshLog = []systemRecord{
	{"$$$scavenges", "$metadata", `{"$maxAge":2592000}`},
	{"$$$settings", "$metadata", `{"$acl":{"$r":"$admins","$w":"$admins"}}`},
	{"$settings", "update-default-acl", `{"$userStreamAcl":{"$r":"$all","$w":"$all"},"$systemStreamAcl":{"$r":"$admins","$w":"$admins"}}`},
	{"$users", "$UserCreated", `"admin"`},
	{"$user-admin", "$user", `{"loginName":"admin","fullName":"KurrentDB Administrator","groups":["$admins"]}`},
	{"$users", "$UserCreated", `"ops"`},
	{"$user-ops", "$user", `{"loginName":"ops","fullName":"KurrentDB Operations","groups":["$ops"]}`},
}

// WithEmptyLog starts the server with nothing in $all, unlike a real node,
// whose fresh log begins with system records (the default here).
func WithEmptyLog() Option { return func(c *config) { c.emptyLog = true } }

// seed writes the fresh log's system records.
func (d *db) seed() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range freshLog {
		cur := d.streams[r.stream].last()
		d.writeLocked(r.stream, cur+1, []proposed{{
			id: uuid.New(), eventType: r.eventType, contentType: "application/json", data: []byte(r.data),
		}})
	}
}
