-- Delayed delivery. next_retry_at is a message's "deliver not before" time (NULL = now).
-- The relay asks for the earliest one still in the future, min(next_retry_at), to sleep
-- until that message is due instead of polling for it; this index answers that with one
-- index probe. It holds only pending rows with a time set, so it stays small.
CREATE INDEX outbox_messages_deliver_after_idx
    ON {{schema}}.outbox_messages (next_retry_at)
    WHERE status = 'pending' AND next_retry_at IS NOT NULL;
