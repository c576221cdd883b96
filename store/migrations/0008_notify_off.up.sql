-- The NOTIFY trigger off by default.
--
-- A transaction that ran NOTIFY takes a global lock in its pre-commit step and holds it
-- through its commit record's flush, so business transactions that enqueue commit one at a
-- time and lose group commit: under concurrent writers the outbox INSERT cost about a
-- quarter of the transaction's throughput beside a bare second row. The relays now poll a
-- cheap claim every 50ms instead (relay.wakeup: poll). relay.wakeup: notify turns the
-- trigger back on (outbox migrate applies it, Store.SetNotify does the same), for a wake-up
-- in milliseconds at that cost.
ALTER TABLE {{schema}}.outbox_messages DISABLE TRIGGER outbox_messages_notify;
