package natsapi

import (
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
)

// Failpoints of the intake (test-only: see Options.Failpoint and ParseFailpoints).
const (
	// FailpointAfterCommitBeforeAck fires once the handler returned a durable
	// outcome (status applied or rejected) and before it is acknowledged: before
	// the JetStream ack on the consumer path, before the reply on the
	// request-reply path (whose reply is its acknowledgement).
	FailpointAfterCommitBeforeAck = "after-commit-before-ack"
	// FailpointAfterAckBeforeReply fires on the consumer path once the ack of a
	// durable outcome reached the server (the connection is flushed first), before
	// anything else happens for that message. The request-reply path has no ack,
	// so it does not fire there.
	FailpointAfterAckBeforeReply = "after-ack-before-reply"
)

// FailpointExitCode is the status a fired failpoint exits with (as SIGKILL's 128+9).
const FailpointExitCode = 137

// ParseFailpoints reads a spec "name:probability[,name:probability...]" (e.g.
// "after-commit-before-ack:0.05,after-ack-before-reply:0.05"). Names must be
// known, probabilities in [0, 1], each name at most once. An empty spec is no
// failpoint (nil).
func ParseFailpoints(spec string) (map[string]float64, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	out := map[string]float64{}
	for _, f := range strings.Split(spec, ",") {
		name, prob, ok := strings.Cut(strings.TrimSpace(f), ":")
		if !ok {
			return nil, fmt.Errorf("failpoint %q: want name:probability", f)
		}
		if name != FailpointAfterCommitBeforeAck && name != FailpointAfterAckBeforeReply {
			return nil, fmt.Errorf("failpoint %q: unknown (known: %s, %s)", name, FailpointAfterCommitBeforeAck, FailpointAfterAckBeforeReply)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("failpoint %q: given twice", name)
		}
		p, err := strconv.ParseFloat(prob, 64)
		if err != nil || !(p >= 0 && p <= 1) {
			return nil, fmt.Errorf("failpoint %q: probability %q not in [0, 1]", name, prob)
		}
		out[name] = p
	}
	return out, nil
}

// FailpointHook returns an Options.Failpoint that, at a named point, writes
// "failpoint <name> fired" to w and calls exit(FailpointExitCode) with the
// point's probability (exit must not return: os.Exit, no cleanup, as SIGKILL).
// Nil for no failpoints.
func FailpointHook(points map[string]float64, w io.Writer, exit func(code int)) func(name string) {
	if len(points) == 0 {
		return nil
	}
	return func(name string) {
		p := points[name]
		if p <= 0 || rand.Float64() >= p {
			return
		}
		fmt.Fprintf(w, "failpoint %s fired\n", name)
		exit(FailpointExitCode)
	}
}

// FailpointString renders points as a spec, sorted by name.
func FailpointString(points map[string]float64) string {
	var fs []string
	for n, p := range points {
		fs = append(fs, n+":"+strconv.FormatFloat(p, 'g', -1, 64))
	}
	sort.Strings(fs)
	return strings.Join(fs, ",")
}
