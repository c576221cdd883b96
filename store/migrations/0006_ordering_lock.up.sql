-- Per-key ordering without a counter row.
--
-- Migration 0003 numbered each key's messages from a counter row that the insert trigger
-- updated. A business transaction at REPEATABLE READ or SERIALIZABLE that updates a row
-- another transaction changed after its snapshot fails with a serialization error, so an
-- ordered Enqueue failed whenever another writer of the key had committed meanwhile.
--
-- Now writers of one key serialise on a transaction-scoped advisory lock instead (the
-- first int4 names this table, the second is the key's hash), and take the number from
-- one sequence. The lock is held until the writer's transaction ends, so the next writer
-- of the key takes its number only after the previous one committed or rolled back: for
-- each key, ordering_seq order is still commit order (with gaps now). A lock is not a row
-- version, so isolation levels above READ COMMITTED no longer conflict. Writers of
-- different keys never wait for each other (unless their keys' hashes collide, which
-- only makes them wait).
--
-- The trigger runs only for rows that have a key: rows without one never enter PL/pgSQL.

CREATE SEQUENCE {{schema}}.outbox_ordering_seq AS bigint;

-- Numbers taken from now on are above every number the counter rows gave.
SELECT setval('{{schema}}.outbox_ordering_seq',
    GREATEST(1,
        (SELECT max(last_seq) FROM {{schema}}.outbox_ordering_keys),
        (SELECT max(ordering_seq) FROM {{schema}}.outbox_messages)));

CREATE OR REPLACE FUNCTION {{schema}}.outbox_messages_order() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(TG_TABLE_SCHEMA || '.outbox_messages'), hashtext(NEW.ordering_key));
    NEW.ordering_seq := nextval('{{schema}}.outbox_ordering_seq');
    RETURN NEW;
END;
$$;

DROP TRIGGER outbox_messages_order ON {{schema}}.outbox_messages;
CREATE TRIGGER outbox_messages_order
    BEFORE INSERT ON {{schema}}.outbox_messages
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION {{schema}}.outbox_messages_order();

DROP TABLE {{schema}}.outbox_ordering_keys;
