-- Dead-letter operations and retention.

-- Who redrove or discarded a dead letter, and when.
ALTER TABLE {{schema}}.outbox_dead_letters
    ADD COLUMN redriven_by  text,
    ADD COLUMN discarded_by text;

-- Every operator action on a message, oldest first.
CREATE TABLE {{schema}}.outbox_audit (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id     uuid        NOT NULL,
    dead_letter_id bigint,
    action         text        NOT NULL CHECK (action IN ('redrive', 'discard')),
    actor          text        NOT NULL,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_audit_message_idx ON {{schema}}.outbox_audit (message_id, at);

-- Open dead letters (neither redriven nor discarded) by time, for dlq list and stats.
CREATE INDEX outbox_dead_letters_open_idx
    ON {{schema}}.outbox_dead_letters (dead_lettered_at)
    WHERE redriven_at IS NULL AND discarded_at IS NULL;

-- Retention finds old sent and discarded rows through these.
CREATE INDEX outbox_messages_sent_at_idx
    ON {{schema}}.outbox_messages (sent_at)
    WHERE status = 'sent';
CREATE INDEX outbox_messages_discarded_idx
    ON {{schema}}.outbox_messages (updated_at)
    WHERE status = 'discarded';
CREATE INDEX outbox_dead_letters_discarded_idx
    ON {{schema}}.outbox_dead_letters (discarded_at)
    WHERE discarded_at IS NOT NULL;

-- Where retention moves rows when archiving is configured: the same columns, no
-- constraints beyond the key, no triggers.
CREATE TABLE {{schema}}.outbox_messages_archive
    (LIKE {{schema}}.outbox_messages INCLUDING DEFAULTS,
     archived_at timestamptz NOT NULL DEFAULT now(),
     PRIMARY KEY (id));
CREATE TABLE {{schema}}.outbox_dead_letters_archive
    (LIKE {{schema}}.outbox_dead_letters INCLUDING DEFAULTS,
     archived_at timestamptz NOT NULL DEFAULT now(),
     PRIMARY KEY (id));
