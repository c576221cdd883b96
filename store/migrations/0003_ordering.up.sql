-- Per-key ordering.
--
-- Messages that share an ordering_key are delivered in commit order. Sequence numbers
-- and transaction IDs from the server do not give commit order under concurrency (a
-- transaction that started earlier may commit later), so each key has a counter row and
-- the insert trigger takes the key's next number with an upsert. The upsert locks the
-- counter row until the writer's transaction ends, so writers of one key serialise: a
-- second writer waits until the first commits (and then takes the next number) or rolls
-- back (and then takes the same number). For each key, ordering_seq order is commit order,
-- with no gaps, and plain-SQL writers get it too. Writers of different keys never wait for
-- each other.

CREATE TABLE {{schema}}.outbox_ordering_keys (
    ordering_key text PRIMARY KEY,
    last_seq     bigint NOT NULL
);

CREATE FUNCTION {{schema}}.outbox_messages_order() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.ordering_key IS NULL THEN
        NEW.ordering_seq := NULL;
        RETURN NEW;
    END IF;
    INSERT INTO {{schema}}.outbox_ordering_keys AS k (ordering_key, last_seq)
    VALUES (NEW.ordering_key, 1)
    ON CONFLICT (ordering_key) DO UPDATE SET last_seq = k.last_seq + 1
    RETURNING k.last_seq INTO NEW.ordering_seq;
    RETURN NEW;
END;
$$;

CREATE TRIGGER outbox_messages_order
    BEFORE INSERT ON {{schema}}.outbox_messages
    FOR EACH ROW
    EXECUTE FUNCTION {{schema}}.outbox_messages_order();

ALTER TABLE {{schema}}.outbox_messages
    ADD CONSTRAINT outbox_messages_ordering_key_check CHECK (length(ordering_key) BETWEEN 1 AND 200);

-- The undelivered messages of each key, for the claim's "nothing earlier is undelivered"
-- test and for stats.
CREATE INDEX outbox_messages_ordering_idx
    ON {{schema}}.outbox_messages (ordering_key, ordering_seq)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'claimed', 'dispatched', 'dead');

-- When an ordered message reaches a final state, the next message of its key may be due:
-- wake the relays.
CREATE FUNCTION {{schema}}.outbox_messages_release() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({{channel}}, '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_messages_release
    AFTER UPDATE OF status ON {{schema}}.outbox_messages
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND NEW.status IN ('sent', 'dead', 'discarded') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {{schema}}.outbox_messages_release();
