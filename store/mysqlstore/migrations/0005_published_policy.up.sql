-- The delivery policy in effect (PostgreSQL's 0014): every topic's policy as the newest
-- configuration file sets it. Each relay and worker publishes its file's policy when it
-- starts, unless the one recorded comes from a file changed later; the relays read it
-- back every few seconds and freeze it into the runs they start. policy_as_of is the
-- file's modification time, policy_by the process and file that published it. The
-- document is compared byte for byte, hence the binary collation; policy_as_of is a
-- DATETIME, which holds any file time in UTC (a TIMESTAMP refuses the Unix epoch that
-- reproducible builds give their files).
ALTER TABLE {{schema}}.outbox_deployment
    ADD COLUMN policy              LONGTEXT     CHARACTER SET utf8mb4 COLLATE {{binary}} NULL,
    ADD COLUMN policy_as_of        DATETIME(6)  NULL,
    ADD COLUMN policy_by           TEXT         CHARACTER SET utf8mb4 NULL,
    ADD COLUMN policy_published_at TIMESTAMP(6) NULL;
