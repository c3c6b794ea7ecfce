package config

import (
	"bytes"
	"strings"
	"testing"
)

// The bar counts from where the work starts: an incremental audit or a
// resumed rebuild carries events it does not read, which are neither done nor
// left; and a stopped run's bar is not drawn full.
func TestEventsBarCountsFromTheStart(t *testing.T) {
	var out bytes.Buffer
	b := newEventsBar(&out, 100, "auditing", 0) // a store of 100 events
	b.progress(0, 60)                           // 60 carried by a checkpoint
	b.progress(10, 60)
	if s := out.String(); !strings.Contains(s, "(10/40,") || strings.Contains(s, "100/") || strings.Contains(s, "60/") {
		t.Fatalf("10 events read after 60 carried, of 100: the bar says\n%q", s)
	}
	b.progress(20, 60)
	out.Reset()
	b.finish(false)
	if s := out.String(); strings.Contains(s, "100%") || strings.Contains(s, "40/40") {
		t.Fatalf("a stopped run's bar was drawn full:\n%q", s)
	}

	out.Reset()
	b = newEventsBar(&out, 100, "rebuilding", 0)
	b.progress(50, 0)
	b.progress(110, 0) // live traffic added events
	if s := out.String(); !strings.Contains(s, "(110/110,") {
		t.Fatalf("110 events of a store that grew from 100: the bar says\n%q", s)
	}
	b.finish(true)
	if s := out.String(); !strings.Contains(s, "100%") {
		t.Fatalf("a completed run's bar is not full:\n%q", s)
	}
}
