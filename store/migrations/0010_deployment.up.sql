-- The deployment: one row that names this outbox (its schema in its database) with an ID
-- of its own, and the Temporal task queue its workflows run on. The relay puts the ID in
-- every workflow's input; a worker of another outbox that receives that workflow or its
-- send refuses it and leaves it to the right worker, instead of reading its own tables
-- for a message they do not hold. The task queue is recorded by outbox migrate (the
-- config's), or by the first relay or worker that starts; a relay configured with another
-- one refuses to start. A task queue belongs to one outbox database.
CREATE TABLE {{schema}}.outbox_deployment (
    singleton     boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    deployment_id uuid        NOT NULL DEFAULT gen_random_uuid(),
    task_queue    text        CHECK (task_queue <> ''),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{schema}}.outbox_deployment DEFAULT VALUES;
