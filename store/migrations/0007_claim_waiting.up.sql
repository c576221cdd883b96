-- A claim that costs the same however many rows wait.
--
-- The claim walked its index in id order and skipped, one by one, every pending row that
-- was not due: rows delayed by next_retry_at, and rows held back behind an earlier
-- undelivered message of their ordering key. With 100,000 such rows each claim read all of
-- them. Now neither kind is on the path of the claim:
--
-- * The claim reads two indexes: rows due at once (next_retry_at NULL) in id order, and
--   delayed rows in next_retry_at order, up to now() only.
-- * A keyed row the claim finds held back is parked (held_back = true), which takes it off
--   both indexes. When a keyed message is sent, dead-lettered or discarded, the release
--   trigger unparks the next parked message of its key. The claim looks again at the rows
--   it parked, in a second transaction that takes the keys' park locks first; the release
--   trigger takes the same lock, so a release that raced the parking is seen by one of
--   the two. The relays also sweep now and then for parked rows whose key no longer holds
--   them (after a change of the topics' ordering settings).

ALTER TABLE {{schema}}.outbox_messages ADD COLUMN held_back boolean NOT NULL DEFAULT false;
ALTER TABLE {{schema}}.outbox_messages_archive ADD COLUMN held_back boolean NOT NULL DEFAULT false;

DROP INDEX {{schema}}.outbox_messages_claim_idx;

-- Rows due at once: pending without a "deliver not before" time, and claimed rows (whose
-- lease may run out). The claim's conditions repeat this predicate, so the planner uses it.
CREATE INDEX outbox_messages_claim_idx
    ON {{schema}}.outbox_messages (id)
    WHERE status IN ('pending', 'claimed') AND next_retry_at IS NULL AND NOT held_back;

-- Delayed rows, by the time they fall due: the claim reads them up to now() and stops.
CREATE INDEX outbox_messages_claim_delayed_idx
    ON {{schema}}.outbox_messages (next_retry_at, id)
    WHERE status IN ('pending', 'claimed') AND next_retry_at IS NOT NULL AND NOT held_back;

-- Parked rows by key, for the release trigger and the sweep.
CREATE INDEX outbox_messages_held_back_idx
    ON {{schema}}.outbox_messages (ordering_key, ordering_seq)
    WHERE held_back;

CREATE OR REPLACE FUNCTION {{schema}}.outbox_messages_release() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(TG_TABLE_SCHEMA || '.outbox_messages.park'), hashtext(NEW.ordering_key));
    UPDATE {{schema}}.outbox_messages SET held_back = false
    WHERE id = (SELECT id FROM {{schema}}.outbox_messages
                WHERE ordering_key = NEW.ordering_key AND held_back
                ORDER BY ordering_seq LIMIT 1);
    PERFORM pg_notify({{channel}}, '');
    RETURN NULL;
END;
$$;
