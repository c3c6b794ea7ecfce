package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

// defaultFileBatch is how many lines of --file go in one batch by default.
const defaultFileBatch = 500

// fileLine is a command of --file: its line number (from 1) and its body.
type fileLine struct {
	n        int
	cmd      client.Raw
	postings int
}

// postFile sends the commands of --file in batches, in the file's order (one
// batch at a time, so the ledger decides them in that order), and prints a
// summary. Every line carries its key, so a run stopped half-way (crash,
// Ctrl-C, SIGTERM, no answer within --timeout) is finished by running it
// again: what was decided answers as a duplicate.
func postFile(ctx context.Context, cmd *cli.Command, nopts config.NATS) error {
	size := int(cmd.Int("batch-size"))
	if size < 1 || size > client.MaxBatchCommands {
		return config.Exit(exitUsage, fmt.Errorf("--batch-size must be 1-%d, got %d", client.MaxBatchCommands, size))
	}
	in, total, err := openLines(cmd.String("file"))
	if err != nil {
		return config.Exit(exitUsage, err)
	}
	defer in.Close()
	nc, err := nopts.Connect("ledger-post")
	if err != nil {
		return config.Exit(exitNoReply, err)
	}
	defer nc.Close()

	s := &fileSender{c: client.New(nc), timeout: cmd.Duration("timeout"), size: size, sum: newFileSummary(int(cmd.Int("show-failures")))}
	errw := cmd.Root().ErrWriter
	if errw == nil {
		errw = os.Stderr
	}
	if !cmd.Bool("no-progress") {
		s.bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(errw), progressbar.OptionSetDescription("posting"),
			progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("lines"),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionSetPredictTime(true),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(errw) }))
	}
	runErr := s.run(ctx, in)
	if s.bar != nil {
		_ = s.bar.Finish()
	}
	out := cmd.Root().Writer
	if out == nil {
		out = os.Stdout
	}
	s.sum.print(out, cmd.String("file"))
	switch {
	case runErr != nil:
		return config.Exit(exitNoReply, fmt.Errorf("stopped at line %d: %w; run the same file again: its keys make that safe", s.stoppedAt, runErr))
	case !s.sum.allApplied():
		return config.Exit(exitAnswered, nil)
	}
	return nil
}

// openLines opens the file (- for standard input) and counts its lines for
// the progress bar (-1 when it cannot be read twice).
func openLines(name string) (io.ReadCloser, int64, error) {
	if name == "" {
		return nil, 0, errors.New("--file needs a file name, or - for standard input")
	}
	if name == "-" {
		return io.NopCloser(os.Stdin), -1, nil
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return f, -1, nil
	}
	var n int64
	r := bufio.NewReaderSize(f, 1<<16)
	buf := make([]byte, 1<<16)
	last := byte('\n')
	for {
		k, err := r.Read(buf)
		n += int64(bytes.Count(buf[:k], []byte{'\n'}))
		if k > 0 {
			last = buf[k-1]
		}
		if err != nil {
			break
		}
	}
	if last != '\n' {
		n++
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, n, nil
}

// fileSender sends a file's lines.
type fileSender struct {
	c       *client.Client
	timeout time.Duration
	size    int
	sum     *fileSummary
	bar     *progressbar.ProgressBar
	// alone: the ledger takes no batches (before v1.2); lines go one by one.
	alone     bool
	stoppedAt int
}

// maxLineBytes bounds a line: a command body is at most 64 KiB; a longer
// line is invalid (and skipped to its end).
const maxLineBytes = client.MaxCommandBytes + 1024

func (s *fileSender) run(ctx context.Context, in io.Reader) error {
	r := bufio.NewReaderSize(in, 1<<16)
	var batch []fileLine
	bytesIn, postings := 0, 0
	flush := func() error {
		err := s.send(ctx, batch)
		batch, bytesIn, postings = batch[:0], 0, 0
		return err
	}
	for n := 1; ; n++ {
		line, tooLong, err := readLine(r)
		if err == io.EOF && line == nil {
			break
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("read line %d: %w", n, err)
		}
		if len(bytes.TrimSpace(line)) == 0 && !tooLong {
			s.progress(1)
			continue
		}
		fl, bad := parseLine(n, line, tooLong)
		if bad != nil {
			s.sum.add(n, *bad)
			s.progress(1)
			continue
		}
		p := fl.postings
		if len(batch) > 0 && (len(batch) == s.size || bytesIn+len(fl.cmd.Body)+32 > client.MaxBatchBytes-1024 || postings+p > client.MaxBatchPostings) {
			if err := flush(); err != nil {
				return err
			}
		}
		batch = append(batch, fl)
		bytesIn += len(fl.cmd.Body) + 32
		postings += p
	}
	if len(batch) > 0 {
		return flush()
	}
	return nil
}

func (s *fileSender) progress(n int) {
	if s.bar != nil {
		_ = s.bar.Add(n)
	}
}

// send sends one batch until each line has a definite answer, or its
// --timeout ends (an error then: the run stops there).
func (s *fileSender) send(ctx context.Context, batch []fileLine) error {
	bctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if !s.alone {
		cmds := make([]client.Command, len(batch))
		for i, l := range batch {
			cmds[i] = l.cmd
		}
		br, err := s.c.Batch(bctx, cmds)
		if err == nil && len(br.Replies) != len(batch) {
			// Refused as a whole: a ledger without batches (v1.1), or one whose
			// limits are smaller. Every line goes alone from now on.
			s.alone = true
		} else {
			for i, r := range br.Replies {
				if r.Status.Definite() {
					s.sum.add(batch[i].n, r)
				} else if s.stoppedAt == 0 {
					s.stoppedAt = batch[i].n
				}
			}
			s.progress(len(batch))
			return err
		}
	}
	for _, l := range batch {
		r, err := s.c.Send(bctx, l.cmd)
		if err != nil {
			s.stoppedAt = l.n
			return err
		}
		s.sum.add(l.n, r)
		s.progress(1)
	}
	return nil
}

// readLine reads one line (without its end), at most maxLineBytes of it:
// tooLong says more was skipped.
func readLine(r *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		part, isPrefix, err := r.ReadLine()
		if len(line)+len(part) <= maxLineBytes {
			line = append(line, part...)
		} else {
			tooLong = true
		}
		if err != nil || !isPrefix {
			if err == io.EOF && (line != nil || tooLong) {
				err = nil
			}
			return line, tooLong, err
		}
	}
}

// parseLine splits a line into its command type and body: a JSON object
// with a "type" naming a client command, no field twice, nothing after it. A
// line that is not is answered invalid here, as the ledger would, and not sent.
func parseLine(n int, line []byte, tooLong bool) (fileLine, *client.Reply) {
	bad := func(field, format string, args ...any) *client.Reply {
		r := &client.Reply{Status: client.StatusInvalid, Code: client.CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
		if field != "" {
			r.Fields = []string{field}
		}
		return r
	}
	if tooLong {
		return fileLine{}, bad("", "the line is over %d bytes (a command body is at most %d)", maxLineBytes, client.MaxCommandBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fileLine{}, bad("", "the line is not a JSON object")
	}
	body := []byte{'{'}
	seen := map[string]bool{}
	typ, postings := "", 0
	for dec.More() {
		tok, err := dec.Token()
		name, ok := tok.(string)
		if err != nil || !ok {
			return fileLine{}, bad("", "the line is not a JSON object")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fileLine{}, bad(name, "malformed JSON value: %v", err)
		}
		if seen[name] {
			return fileLine{}, bad(name, "appears more than once")
		}
		seen[name] = true
		if name == "postings" {
			var ps []json.RawMessage
			_ = json.Unmarshal(raw, &ps) // the ledger judges a malformed one
			postings = len(ps)
		}
		if name == "type" {
			if json.Unmarshal(raw, &typ) != nil || !domain.CommandType(typ).IsClient() {
				return fileLine{}, bad("type", "must name a command: %s", commandTypes())
			}
			continue
		}
		if len(body) > 1 {
			body = append(body, ',')
		}
		k, _ := json.Marshal(name)
		body = append(append(append(body, k...), ':'), raw...)
	}
	if _, err := dec.Token(); err != nil {
		return fileLine{}, bad("", "the line is not a JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return fileLine{}, bad("", "trailing data after the JSON object")
	}
	if typ == "" {
		return fileLine{}, bad("type", "is required: %s", commandTypes())
	}
	body = append(body, '}')
	return fileLine{n: n, cmd: client.Raw{Type: typ, Body: body}, postings: postings}, nil
}

func commandTypes() string {
	names := make([]string, len(domain.ClientCommandTypes))
	for i, t := range domain.ClientCommandTypes {
		names[i] = string(t)
	}
	return strings.Join(names, ", ")
}

// fileSummary tallies the answers of a file's lines, in bounded memory: the
// counts by code and the first failing lines (the show lowest numbers: a line
// found invalid as it is read is counted before the lines above it that are
// in a batch still being answered).
type fileSummary struct {
	lines, applied, duplicate int
	rejected, invalid         map[client.Code]int
	failures                  []failedLine // by line number, at most show
	show                      int
}

// failedLine is a failing line of the summary: its number and what it says.
type failedLine struct {
	n    int
	text string
}

func newFileSummary(show int) *fileSummary {
	return &fileSummary{rejected: map[client.Code]int{}, invalid: map[client.Code]int{}, show: max(0, show)}
}

// add counts line n's answer: applied now, applied before (a duplicate of an
// applied outcome), or a failure (rejected, now or by an earlier run; invalid).
func (s *fileSummary) add(n int, r client.Reply) {
	s.lines++
	switch {
	case r.Status == client.StatusApplied && r.Duplicate:
		s.duplicate++
		return
	case r.Status == client.StatusApplied:
		s.applied++
		return
	case r.Status == client.StatusRejected:
		s.rejected[r.Code]++
	default:
		s.invalid[r.Code]++
	}
	i, _ := slices.BinarySearchFunc(s.failures, n, func(f failedLine, n int) int { return cmp.Compare(f.n, n) })
	if i < s.show {
		f := fmt.Sprintf("  line %d: %s %s", n, r.Status, r.Code)
		if r.Key != "" {
			f += " (key " + r.Key + ")"
		}
		if r.Duplicate {
			f += " (decided by an earlier run)"
		}
		if len(r.Fields) > 0 {
			f += " fields " + strings.Join(r.Fields, ",")
		}
		if r.Message != "" {
			f += ": " + r.Message
		}
		s.failures = slices.Insert(s.failures, i, failedLine{n, f})
		s.failures = s.failures[:min(len(s.failures), s.show)]
	}
}

func (s *fileSummary) allApplied() bool { return len(s.rejected) == 0 && len(s.invalid) == 0 }

func byCode(m map[client.Code]int) (int, string) {
	total := 0
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(m)) {
		total += m[c]
		parts = append(parts, fmt.Sprintf("%s %d", c, m[c]))
	}
	return total, strings.Join(parts, ", ")
}

func (s *fileSummary) print(w io.Writer, name string) {
	rej, rejBy := byCode(s.rejected)
	inv, invBy := byCode(s.invalid)
	fmt.Fprintf(w, "%s: %d lines answered\n", name, s.lines)
	fmt.Fprintf(w, "  applied    %d\n", s.applied)
	fmt.Fprintf(w, "  duplicate  %d (applied before: by an earlier run or line)\n", s.duplicate)
	fmt.Fprintf(w, "  rejected   %d %s\n", rej, rejBy)
	fmt.Fprintf(w, "  invalid    %d %s\n", inv, invBy)
	if len(s.failures) > 0 {
		fmt.Fprintln(w, "first failing lines:")
		for _, f := range s.failures {
			fmt.Fprintln(w, f.text)
		}
	}
}
