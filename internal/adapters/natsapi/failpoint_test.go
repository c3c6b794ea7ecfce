package natsapi

import (
	"bytes"
	"testing"
)

func TestParseFailpointsRejectsBadSpecs(t *testing.T) {
	for _, spec := range []string{
		"after-commit-before-ack",                               // no probability
		"after-commit-before-ack:",                              // empty probability
		"after-commit-before-ack:x",                             // not a number
		"after-commit-before-ack:-0.1",                          // below 0
		"after-commit-before-ack:1.5",                           // above 1
		"after-commit-before-ack:NaN",                           // not a probability
		"before-everything:0.1",                                 // unknown point
		"after-commit-before-ack:0.1,",                          // empty item
		"after-ack-before-reply:0.1,after-ack-before-reply:0.2", // twice
	} {
		if _, err := ParseFailpoints(spec); err == nil {
			t.Errorf("ParseFailpoints(%q) accepted", spec)
		}
	}
	p, err := ParseFailpoints(" after-commit-before-ack:0.05, after-ack-before-reply:1 ")
	if err != nil || p[FailpointAfterCommitBeforeAck] != 0.05 || p[FailpointAfterAckBeforeReply] != 1 {
		t.Fatalf("got %v, %v", p, err)
	}
	if got := FailpointString(p); got != "after-ack-before-reply:1,after-commit-before-ack:0.05" {
		t.Fatalf("FailpointString = %q", got)
	}
	if p, err := ParseFailpoints(""); err != nil || p != nil || FailpointHook(p, nil, nil) != nil {
		t.Fatalf("empty spec: %v, %v", p, err)
	}
}

func TestFailpointHook(t *testing.T) {
	var out bytes.Buffer
	var codes []int
	hook := FailpointHook(map[string]float64{FailpointAfterCommitBeforeAck: 0, FailpointAfterAckBeforeReply: 1}, &out, func(c int) { codes = append(codes, c) })
	for i := 0; i < 100_000; i++ {
		hook(FailpointAfterCommitBeforeAck) // probability 0: never
		hook("not-configured")
	}
	if len(codes) != 0 || out.Len() != 0 {
		t.Fatalf("probability 0 fired: %v %q", codes, out.String())
	}
	hook(FailpointAfterAckBeforeReply) // probability 1: always
	if len(codes) != 1 || codes[0] != FailpointExitCode || out.String() != "failpoint after-ack-before-reply fired\n" {
		t.Fatalf("probability 1: %v %q", codes, out.String())
	}
}
