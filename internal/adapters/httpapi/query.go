package httpapi

import (
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Router is where QueryRoutes registers its handlers (an *http.ServeMux, or a
// Server).
type Router interface {
	Handle(pattern string, h http.Handler)
}

// QueryRoutes registers the read side's queries, answered by svc:
//
//	GET /v1/accounts/{id}                ?min_position=c/p
//	GET /v1/accounts/{id}/entries        ?after_revision=N&limit=N&from=T&to=T&by=effective&min_position=c/p
//	GET /v1/accounts/{id}/balance        ?at=T&revision=N&effective_at=T&min_position=c/p
//	GET /v1/balances                     ?prefix=P&currency=C&at=T&effective_at=T&min_position=c/p
//	GET /v1/transfers/{id}               ?min_position=c/p
//	GET /v1/commands/{key}               ?min_position=c/p
//
// Replies are the NATS replies. A parameter not listed, or one given twice, is
// invalid_request naming it, as an unknown field of a NATS query is (a
// misspelt effective_at must not answer the current balances). Errors are
// answered 400 (invalid_request), 404
// (not_found), 503 with Retry-After (projection_behind) or 500.
func QueryRoutes(r Router, svc *query.Service) {
	r.Handle("GET /v1/accounts/{id}", queryHandler(svc, query.QueryAccount, []string{"min_position"}, func(req *http.Request) (any, *reply.QueryError) {
		return svc.Account(req.Context(), query.AccountRequest{AccountID: req.PathValue("id"), MinPosition: req.URL.Query().Get("min_position")})
	}))
	r.Handle("GET /v1/accounts/{id}/entries", queryHandler(svc, query.QueryEntries, []string{"after_revision", "limit", "from", "to", "by", "min_position"}, func(req *http.Request) (any, *reply.QueryError) {
		q := query.EntriesRequest{AccountID: req.PathValue("id"), MinPosition: req.URL.Query().Get("min_position"),
			From: req.URL.Query().Get("from"), To: req.URL.Query().Get("to"), By: req.URL.Query().Get("by")}
		var qerr *reply.QueryError
		if q.AfterRevision, qerr = intParam[int64](req, "after_revision"); qerr != nil {
			return nil, qerr
		}
		if q.Limit, qerr = intParam[int](req, "limit"); qerr != nil {
			return nil, qerr
		}
		return svc.Entries(req.Context(), q)
	}))
	r.Handle("GET /v1/accounts/{id}/balance", queryHandler(svc, query.QueryBalance, []string{"at", "revision", "effective_at", "min_position"}, func(req *http.Request) (any, *reply.QueryError) {
		q := query.BalanceRequest{AccountID: req.PathValue("id"), At: req.URL.Query().Get("at"), EffectiveAt: req.URL.Query().Get("effective_at"),
			MinPosition: req.URL.Query().Get("min_position")}
		var qerr *reply.QueryError
		if q.Revision, qerr = intParam[int64](req, "revision"); qerr != nil {
			return nil, qerr
		}
		return svc.Balance(req.Context(), q)
	}))
	r.Handle("GET /v1/balances", queryHandler(svc, query.QueryBalances, []string{"prefix", "currency", "at", "effective_at", "min_position"}, func(req *http.Request) (any, *reply.QueryError) {
		p := req.URL.Query()
		return svc.Balances(req.Context(), query.BalancesRequest{Prefix: p.Get("prefix"), Currency: p.Get("currency"),
			At: p.Get("at"), EffectiveAt: p.Get("effective_at"), MinPosition: p.Get("min_position")})
	}))
	r.Handle("GET /v1/transfers/{id}", queryHandler(svc, query.QueryTransfer, []string{"min_position"}, func(req *http.Request) (any, *reply.QueryError) {
		return svc.Transfer(req.Context(), query.TransferRequest{TransferID: req.PathValue("id"), MinPosition: req.URL.Query().Get("min_position")})
	}))
	r.Handle("GET /v1/commands/{key...}", queryHandler(svc, query.QueryCommand, []string{"min_position"}, func(req *http.Request) (any, *reply.QueryError) {
		return svc.Command(req.Context(), query.CommandRequest{IdempotencyKey: req.PathValue("key"), MinPosition: req.URL.Query().Get("min_position")})
	}))
}

// intParam reads an optional integer query parameter (nil when absent).
func intParam[N int | int64](req *http.Request, name string) (*N, *reply.QueryError) {
	v := req.URL.Query().Get(name)
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || int64(N(n)) != n {
		return nil, reply.InvalidQuery(name, "%q is not an integer", v)
	}
	out := N(n)
	return &out, nil
}

// queryHandler answers one query over HTTP, taking the URL parameters params:
// its reply, or its error with the HTTP status of its code.
func queryHandler(svc *query.Service, name string, params []string, answer func(*http.Request) (any, *reply.QueryError)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		out, qerr := svc.Observe(name, func() (any, *reply.QueryError) {
			if qerr := CheckParams(req.URL.Query(), params); qerr != nil {
				return nil, qerr
			}
			return answer(req)
		})
		status := http.StatusOK
		if qerr != nil {
			out, status = qerr, StatusOf(qerr.Code)
			if qerr.Code == reply.CodeProjectionBehind {
				w.Header().Set("Retry-After", "1")
			}
		}
		WriteJSON(w, status, out)
	})
}

// CheckParams refuses a URL parameter that is not one of params, or that is
// given more than once, naming it (the first in name order, so that the
// answer does not depend on the map's order): every read route's rule.
func CheckParams(got url.Values, params []string) *reply.QueryError {
	names := slices.Sorted(maps.Keys(got))
	for _, name := range names {
		switch {
		case !slices.Contains(params, name):
			return reply.InvalidQuery(name, "unknown parameter (this query takes %s)", strings.Join(params, ", "))
		case len(got[name]) > 1:
			return reply.InvalidQuery(name, "given %d times, at most once", len(got[name]))
		}
	}
	return nil
}
