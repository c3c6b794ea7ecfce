package main

import (
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestRunPatternSelectsEveryIncludedCase(t *testing.T) {
	for _, r := range runs {
		levels := strings.Split(runPattern(r.cases), "/")
		for _, name := range r.cases {
			parts := strings.Split(name, "/")
			if len(parts) != len(levels) {
				t.Fatalf("%s: %s: %d levels, the pattern has %d", r.name, name, len(parts), len(levels))
			}
			for i, p := range parts {
				if !regexp.MustCompile(levels[i]).MatchString(p) {
					t.Errorf("%s: %s: level %d (%q) does not match %s", r.name, name, i, p, levels[i])
				}
			}
		}
		if regexp.MustCompile(levels[0]).MatchString("TestStreamsX") {
			t.Errorf("%s: %s matches a longer name", r.name, levels[0])
		}
	}
}

func TestReportKeepsCasesNotParents(t *testing.T) {
	in := `{"Action":"run","Test":"TestA"}
{"Action":"run","Test":"TestA/G"}
{"Action":"run","Test":"TestA/G/ok"}
{"Action":"output","Test":"TestA/G/ok","Output":"fine\n"}
{"Action":"pass","Test":"TestA/G/ok"}
{"Action":"run","Test":"TestA/G/bad"}
{"Action":"output","Test":"TestA/G/bad","Output":"broken\n"}
{"Action":"fail","Test":"TestA/G/bad"}
{"Action":"fail","Test":"TestA/G"}
{"Action":"fail","Test":"TestA"}
`
	var out strings.Builder
	cases, err := report(strings.NewReader(in), &out, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []result{{"TestA/G/ok", "pass"}, {"TestA/G/bad", "fail"}}
	if !slices.Equal(cases, want) {
		t.Errorf("cases %v, want %v", cases, want)
	}
	if out.String() != "broken\n" {
		t.Errorf("printed %q, want only the failed case's output", out.String())
	}
	if _, err := report(strings.NewReader("not json\n"), io.Discard, false); err != nil {
		t.Errorf("a line that is not JSON: %v", err)
	}
}
