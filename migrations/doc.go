// Package migrations holds the SQL of the PostgreSQL event store and of the read
// models, embedded and applied in order by goose (github.com/pressly/goose/v3).
// Files are numbered NNNNN_name.sql; Up is safe to call from several processes at once.
package migrations
