package kurrenttest_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/EventStore/EventStore-Client-Go/v4/protos/shared"
	api "github.com/EventStore/EventStore-Client-Go/v4/protos/streams"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
)

// sendAppend sends an append of msgs as user and returns the first error of
// its sends (nil when the whole request went out) and the call's answer.
func sendAppend(t *testing.T, rc api.StreamsClient, user string, msgs ...*api.AppendReq_ProposedMessage) (sendErr error, resp *api.AppendResp, trailer metadata.MD, err error) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user)))
	ac, err := rc.Append(ctx, grpc.Trailer(&trailer))
	if err != nil {
		t.Fatal(err)
	}
	sendErr = ac.Send(&api.AppendReq{Content: &api.AppendReq_Options_{Options: &api.AppendReq_Options{
		StreamIdentifier:       &shared.StreamIdentifier{StreamName: []byte("s-" + uuid.NewString())},
		ExpectedStreamRevision: &api.AppendReq_Options_Any{Any: &shared.Empty{}},
	}}})
	for _, m := range msgs {
		if sendErr != nil {
			break
		}
		sendErr = ac.Send(&api.AppendReq{Content: &api.AppendReq_ProposedMessage_{ProposedMessage: m}})
	}
	resp, err = ac.CloseAndRecv()
	return sendErr, resp, trailer, err
}

// TestEarlyRefusalsAndTheEventLimit: WithEarlyRefusals refuses an append of a
// user without the right to write on its header, without reading the rest, so
// a client still sending 24 MiB sees its Send fail (the status comes with
// CloseAndRecv); WithMaxAppendEventSize refuses an event over it with the
// server's message and trailers. (Neither option existed before issue 26.)
func TestEarlyRefusalsAndTheEventLimit(t *testing.T) {
	s, _ := kurrenttest.Start(t,
		kurrenttest.WithUsers(
			kurrenttest.User{Name: "admin", Password: "a", Admin: true},
			kurrenttest.User{Name: "reader", Password: "r", ReadOnly: true}),
		kurrenttest.WithEarlyRefusals(),
		kurrenttest.WithMaxAppendEventSize(128<<10))
	rc := raw(t, s)
	big := proposal(uuid.New(), "Test", make([]byte, 1<<20))
	msgs := make([]*api.AppendReq_ProposedMessage, 24)
	for i := range msgs {
		msgs[i] = big
	}
	sendErr, _, _, err := sendAppend(t, rc, "reader:r", msgs...)
	if sendErr == nil || status.Code(err) != codes.PermissionDenied {
		t.Fatalf("24 MiB by a user who may not write: send %v, answer %v; want the send cut short and PermissionDenied", sendErr, err)
	}
	if _, resp, _, err := sendAppend(t, rc, "reader:r"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("its header alone: %v, %v", resp, err)
	}
	_, _, trailer, err := sendAppend(t, rc, "admin:a", proposal(uuid.New(), "Test", make([]byte, 200<<10)))
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "exceeds Maximum Append Event Size of 131072.") ||
		len(trailer.Get("exception")) == 0 || trailer.Get("exception")[0] != "maximum-append-event-size-exceeded" {
		t.Fatalf("an event of 200 KiB over a limit of 128 KiB: %v, trailers %v", err, trailer)
	}
	if _, resp, _, err := sendAppend(t, rc, "admin:a", proposal(uuid.New(), "Test", make([]byte, 100<<10))); err != nil || resp.GetSuccess() == nil {
		t.Fatalf("an event of 100 KiB: %v, %v", resp, err)
	}
}
