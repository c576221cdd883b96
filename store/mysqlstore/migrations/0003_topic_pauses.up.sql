-- Paused topics (PostgreSQL's 0012). While a topic is listed here the relays hand none of
-- its messages over: a claim that meets one of its rows parks it (held_back, as it parks a
-- keyed row held back behind its key), and a send of a message handed over earlier waits
-- without using an attempt. Resuming deletes the row and unparks the topic's rows; the
-- relays' periodic sweep unparks a row whose pause ended while a claim was parking it.
-- `outbox topic pause` and `resume` write it; it survives restarts of every process.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_topic_pauses (
    topic     VARCHAR(200)  CHARACTER SET utf8mb4 COLLATE {{binary}} NOT NULL,
    paused_at TIMESTAMP(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    paused_by VARCHAR(200)  CHARACTER SET utf8mb4 NOT NULL,
    reason    VARCHAR(1000) CHARACTER SET utf8mb4 NOT NULL DEFAULT '',
    PRIMARY KEY (topic)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;
