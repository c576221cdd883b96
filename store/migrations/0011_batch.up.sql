-- The batch lane. A topic with lane: batch has its rows handed over in batches, each batch
-- to one OutboxBatch run, which sends them together; a message the batch cannot deliver
-- leaves it for a delivery run of its own (OutboxDelivery, outbox-<message_id>). batch_id
-- is the workflow ID of the batch run a row was handed to: the run sends only the rows
-- that name it (or that no run has taken yet), reconciliation asks that run about a row
-- that has no run of its own, and outbox show names it. NULL for a row of the message
-- lane. A nullable column without a default: adding it rewrites nothing.
ALTER TABLE {{schema}}.outbox_messages ADD COLUMN batch_id text;
ALTER TABLE {{schema}}.outbox_messages_archive ADD COLUMN batch_id text;
