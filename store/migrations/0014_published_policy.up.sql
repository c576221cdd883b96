-- The delivery policy in effect: every topic's policy (attempts, backoff, timeouts, first
-- attempt, a team's activity or workflow) as the newest configuration file sets it. Each
-- relay and worker publishes its file's policy when it starts, unless the one recorded
-- comes from a file changed later; the relays read it back every few seconds and freeze it
-- into the runs they start. A policy change thus reaches new runs whichever process reads
-- the changed file first, and a process restarted with an older file follows the newer
-- policy instead of bringing its own back. policy_as_of is the file's modification time,
-- policy_by the process and file that published it.
ALTER TABLE {{schema}}.outbox_deployment
    ADD COLUMN policy              jsonb,
    ADD COLUMN policy_as_of        timestamptz,
    ADD COLUMN policy_by           text,
    ADD COLUMN policy_published_at timestamptz;
