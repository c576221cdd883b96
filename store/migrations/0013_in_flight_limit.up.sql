-- The relays' limit on a topic's messages in flight (relay.max_in_flight_per_topic).
--
-- A claim counts a topic's rows in flight (dispatched, or claimed under a lease that has
-- not run out) and parks the topic's due rows beyond the limit, as it parks a paused
-- topic's rows: they leave the claim's indexes, so a topic with a backlog of thousands
-- costs the claim nothing, and the rows of every other topic committed after the backlog
-- are claimed at once. Before each claim the relay unparks, oldest first, as many of a
-- topic's parked rows as the topic has room for.

-- Rows in flight by topic, for the count.
CREATE INDEX outbox_messages_in_flight_idx
    ON {{schema}}.outbox_messages (topic)
    WHERE status IN ('claimed', 'dispatched');

-- Parked rows without an ordering key (a paused topic's or a topic's at its limit), by
-- topic in commit order, for the unparking.
CREATE INDEX outbox_messages_parked_topic_idx
    ON {{schema}}.outbox_messages (topic, id)
    WHERE held_back AND ordering_key IS NULL;
