// Package kurrenttest is an in-process KurrentDB for tests: a gRPC server on
// 127.0.0.1 that registers EventStore-Client-Go/v4's generated Streams,
// ServerFeatures and Gossip services and answers with the server's semantics
// (IndexWriter idempotency, $all positions, catch-up subscriptions with filters,
// checkpoints and caught_up, created ticks, stream_not_found, tombstones, soft
// deletes and their un-delete, stream metadata hiding events from reads, the
// maximum append size, a fresh log's system records), plus fault injection:
// Unavailable, dropped subscriptions, appends left unanswered, answers lost after
// the write, held replication, not-leader answers. WithRelease picks the release
// modelled where releases differ; WithTLS and WithUsers make it a secure node.
//
// It keeps everything in memory and proves nothing about durability,
// clustering or performance.
package kurrenttest
