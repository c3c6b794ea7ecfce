// Package storetest is the one conformance suite every event-store backend runs
// (memory, postgres, kurrentdb): Run(t, newStore). It uses only the contract of
// package eventstore and the optional capabilities it detects by type assertion.
package storetest
