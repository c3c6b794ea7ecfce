package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// /debug/pprof/ is served only when Options.Pprof asks for it.
func TestPprofOnlyWhenAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		srv := httptest.NewServer(New(Options{Pprof: on}).Handler())
		resp, err := http.Get(srv.URL + "/debug/pprof/heap?debug=1")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		served := resp.StatusCode == http.StatusOK && strings.Contains(string(body), "heap profile:")
		if served != on {
			t.Fatalf("Pprof %v: /debug/pprof/heap answered %d:\n%.200s", on, resp.StatusCode, body)
		}
	}
}
