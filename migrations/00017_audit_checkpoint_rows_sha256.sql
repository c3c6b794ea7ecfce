-- Audit checkpoints' account rows bound by sha256 (review of bca0377):
-- accounts_digest (00013), a sum of 60-bit unkeyed hashes of each row over
-- a '/'-joined text, let two rows be edited to cancel out (some 2^30 md5
-- evaluations) and text move between two columns unseen.
--
-- accounts_sha256   sha256, in hex, over the sha256 of each of the
--                   checkpoint's account rows (the row's text form, every
--                   column quoted as a record is), sorted: one set of rows,
--                   one digest, in any order of reading; another set with
--                   the same digest is a sha256 collision
--                   (projections/checkpoints.go owns the SQL)
--
-- accounts_digest is no longer written. A checkpoint without accounts_sha256
-- (NULL: one of an earlier build) is refused: a full audit stores a new one.

-- +goose Up
ALTER TABLE readmodel.audit_checkpoints ADD COLUMN accounts_sha256 text;

-- +goose Down
-- An earlier build would refuse these checkpoints (no accounts_digest), as
-- one of a still earlier build: they go.
DELETE FROM readmodel.audit_checkpoints WHERE accounts_sha256 IS NOT NULL;
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN accounts_sha256;
