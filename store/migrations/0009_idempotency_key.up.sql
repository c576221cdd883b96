-- A natural idempotency key the application may give a message (such as
-- "order-42-created"): a second enqueue with the same key writes nothing and is reported as
-- a duplicate, without an error that would abort the caller's transaction. The key is
-- unique among the rows the table holds; retention frees it with its row.
ALTER TABLE {{schema}}.outbox_messages ADD COLUMN idempotency_key text;
ALTER TABLE {{schema}}.outbox_messages_archive ADD COLUMN idempotency_key text;
CREATE UNIQUE INDEX outbox_messages_idempotency_key_idx ON {{schema}}.outbox_messages (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
