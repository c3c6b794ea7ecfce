// Package audit checks the ledger against its own events (PROTOCOL.md §6): it folds
// "all" with the domain's Evolve, checks the invariants (keys decided once, money
// conserved per currency, balances equal to the fold and within their overdraft,
// revisions gapless and event IDs unique), optionally recomputes every stream's
// hash chain, and compares each read model with the fold (invariant 4).
//
// `ledger audit` prints its Report; `projector rebuild` calls VerifyGeneration
// before it lets a new generation go live; tests and the fault-injection suite
// call Run directly.
package audit
