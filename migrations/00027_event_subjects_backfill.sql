-- Every hold event and every refund stored carries its subject (issue 23).
-- One written by a build before events had subjects (before 00007's build,
-- or an instance of one still serving during a rolling upgrade) has none in
-- its row, so the store's read of a subject (eventstore.SubjectReader) missed
-- it: the ledger's recall of a refunded original or a closed hold it forgot
-- (domain.RecallRefunded, RecallHold) and the audit's check of a snapshot's
-- refunded sums. An original refunded so, met by an aggregate after it forgot
-- some, was refunded beyond its amount, and a snapshot's sum of it could be
-- lowered by that refund unseen; a hold placed with its subject and closed
-- without one read as active once forgotten. This gives each such row the
-- subject the ledger writes today (domain.EventSubject): hold:<hold_id> on
-- HoldPlaced, HoldCaptured and HoldReleased, refund:<ref> on a Credited or
-- Debited of reason refund (ref: the original's key). Only the indexed
-- column changes: the event's metadata, and so its chain hash and whether
-- the ledger counts the hold or the original findable, stay as written.
-- docs/design.md ("Closed holds and refunded originals found by their
-- subject") says why, docs/operations.md ("Upgrading") what an upgrade does.
--
-- One pass over the events (a sequential scan, decoding the data of those
-- five types only) in the migration's transaction: it locks the rows it
-- changes, which nothing else writes, and blocks no append. Applied again
-- (rolled back and up) it changes only the rows that still have none.

-- +goose Up
UPDATE events e SET subject = s.subject
FROM (
    SELECT position, CASE
            WHEN type IN ('HoldPlaced', 'HoldCaptured', 'HoldReleased') THEN 'hold:' || (d ->> 'hold_id')
            WHEN d ->> 'reason' = 'refund' THEN 'refund:' || (d ->> 'ref')
        END AS subject
    FROM (SELECT position, type, convert_from(data, 'UTF8')::jsonb AS d FROM events
        WHERE subject IS NULL AND type IN ('HoldPlaced', 'HoldCaptured', 'HoldReleased', 'Credited', 'Debited')) t
) s
WHERE e.position = s.position AND s.subject IS NOT NULL;

-- +goose Down
-- The subjects stay: the build before reads them as its own (it writes them
-- so).
SELECT 1;
