-- Paused topics. While a topic is listed here the relays hand none of its messages over:
-- a claim that meets one of its rows parks it (held_back, as it parks a keyed row held
-- back behind its key), which takes it off the claim's indexes, and a send of a message
-- handed over earlier waits without using an attempt. Resuming deletes the row and
-- unparks the topic's rows; a keyed row that its key still holds back is parked again by
-- the next claim. The relays' periodic sweep unparks a row whose pause ended while a
-- claim was parking it. `outbox topic pause` and `resume` write it; it survives restarts
-- of every process.
CREATE TABLE {{schema}}.outbox_topic_pauses (
    topic     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL,
    reason    text        NOT NULL DEFAULT ''
);
