// Package kurrenttest is an in-process KurrentDB for tests: a gRPC server on
// 127.0.0.1 that registers EventStore-Client-Go/v4's generated Streams,
// ServerFeatures and Gossip services and answers with the server's semantics
// (IndexWriter idempotency, $all positions, catch-up subscriptions with filters,
// checkpoints and caught_up, created ticks, stream_not_found, tombstones), plus
// fault injection: Unavailable, dropped subscriptions, appends left unanswered.
//
// It keeps everything in memory and proves nothing about durability,
// clustering or performance.
package kurrenttest
