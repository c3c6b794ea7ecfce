package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness check: nil when the dependency answers.
type Check func(ctx context.Context) error

// Options configure a Server.
type Options struct {
	// Addr is the listen address (host:port; port 0 picks a free one).
	Addr string
	// Gatherer serves /metrics; nil serves prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// CheckTimeout bounds each readiness check (default 2s).
	CheckTimeout time.Duration
	// Pprof serves the runtime's profiles under /debug/pprof/ (heap, goroutine,
	// CPU for ?seconds= under the server's 60 s write timeout). Off by default:
	// the profiles show the process's memory, so turn it on only where the
	// address is not reachable by others.
	Pprof  bool
	Logger *slog.Logger
}

// Server serves the operational endpoints and any routes added with Handle.
type Server struct {
	opts     Options
	mux      *http.ServeMux
	srv      *http.Server
	ln       net.Listener
	log      *slog.Logger
	mu       sync.Mutex
	checks   map[string]Check
	draining atomic.Bool
	done     chan error
}

// New returns a Server; Start listens.
func New(opts Options) *Server {
	if opts.Gatherer == nil {
		opts.Gatherer = prometheus.DefaultGatherer
	}
	if opts.CheckTimeout <= 0 {
		opts.CheckTimeout = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{opts: opts, mux: http.NewServeMux(), log: opts.Logger.With("component", "http"), checks: map[string]Check{}}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{ErrorLog: slogErrorLog{s.log}}))
	if opts.Pprof {
		s.mux.HandleFunc("GET /debug/pprof/", pprof.Index) // heap, goroutine, allocs... by name
		s.mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		s.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		s.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		s.mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return s
}

// AddCheck adds a named readiness check; /readyz answers 200 only when all pass.
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// Handle adds a route (http.ServeMux pattern syntax).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler is the server's mux (for tests that use httptest).
func (s *Server) Handler() http.Handler { return s.mux }

// Start listens on Addr and serves in the background.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("httpapi: listen %s: %w", s.opts.Addr, err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	s.done = make(chan error, 1)
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	s.log.Info("http listening", "url", s.URL())
	return nil
}

// URL is the base URL the server listens on (after Start).
func (s *Server) URL() string {
	if s.ln == nil {
		return ""
	}
	return "http://" + s.ln.Addr().String()
}

// SetDraining makes /readyz answer 503 from now on: the program is shutting down.
func (s *Server) SetDraining() { s.draining.Store(true) }

// Shutdown stops accepting connections and waits, up to ctx, for those in flight.
func (s *Server) Shutdown(ctx context.Context) error {
	s.SetDraining()
	if s.srv == nil {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
	}
	if serr := <-s.done; err == nil {
		err = serr
	}
	return err
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		WriteJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "draining"})
		return
	}
	s.mu.Lock()
	names := make([]string, 0, len(s.checks))
	checks := make(map[string]Check, len(s.checks))
	for n, c := range s.checks {
		names = append(names, n)
		checks[n] = c
	}
	s.mu.Unlock()
	sort.Strings(names)
	results := make(map[string]string, len(names))
	ok := true
	for _, n := range names {
		ctx, cancel := context.WithTimeout(r.Context(), s.opts.CheckTimeout)
		err := checks[n](ctx)
		cancel()
		if err != nil {
			ok = false
			results[n] = err.Error()
		} else {
			results[n] = "ok"
		}
	}
	code, status := http.StatusOK, "ready"
	if !ok {
		code, status = http.StatusServiceUnavailable, "not_ready"
	}
	WriteJSON(w, code, map[string]any{"status": status, "checks": results})
}

// WriteJSON answers with status and v as JSON (one line).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// StatusOf is the HTTP status of a query answered with code, the one mapping
// every read route uses: a bad request is 400, something that does not exist
// 404, a read model behind the asked position 503, anything else 500.
func StatusOf(code domain.Code) int {
	switch code {
	case domain.CodeInvalidRequest:
		return http.StatusBadRequest
	case domain.CodeNotFound, domain.CodeAccountNotFound:
		return http.StatusNotFound
	case reply.CodeProjectionBehind:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

type slogErrorLog struct{ l *slog.Logger }

func (e slogErrorLog) Println(v ...any) { e.l.Error(fmt.Sprint(v...)) }
