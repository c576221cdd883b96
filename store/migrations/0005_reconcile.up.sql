-- Reconciliation: the relay repairs rows whose workflow went missing or closed without
-- recording its outcome, and audits what it did.
ALTER TABLE {{schema}}.outbox_audit DROP CONSTRAINT outbox_audit_action_check;
ALTER TABLE {{schema}}.outbox_audit
    ADD CONSTRAINT outbox_audit_action_check CHECK (action IN ('redrive', 'discard', 'reconcile')),
    ADD COLUMN detail text;
CREATE INDEX outbox_audit_action_idx ON {{schema}}.outbox_audit (action, at);
