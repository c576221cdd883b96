-- The batch lane (PostgreSQL's 0011). A topic with lane: batch has its rows handed over in
-- batches, each batch to one OutboxBatch run, which sends them together; a message the
-- batch cannot deliver leaves it for a delivery run of its own. batch_id is the workflow
-- ID of the batch run a row was handed to: the run sends only the rows that name it (or
-- that no run has taken yet), reconciliation asks that run about a row that has no run of
-- its own, and outbox show names it. NULL for a row of the message lane. Adding a column
-- at the end is instant in InnoDB (MySQL 8.0.12+, MariaDB 10.3+): no copy of the table.
-- Migrate treats "duplicate column" as this statement having run already, so a
-- migration interrupted after it resumes.
ALTER TABLE {{schema}}.outbox_messages ADD COLUMN batch_id VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NULL;
ALTER TABLE {{schema}}.outbox_messages_archive ADD COLUMN batch_id VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NULL;
