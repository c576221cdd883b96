-- The relays' limit on a topic's messages in flight (PostgreSQL's 0013). A claim counts a
-- topic's rows in flight (dispatched, or claimed under a lease that has not run out) and
-- parks the topic's due rows beyond the limit, as it parks a paused topic's rows: they
-- leave the claim's index, so a topic's backlog costs the claim nothing. Before each claim
-- the relay unparks, oldest first, as many of a topic's parked rows as it has room for.
-- It finds them through the index of parked rows, which now ends with the topic: the
-- parked rows without a key are then in topic order and, within a topic, in id order (the
-- primary key that every InnoDB secondary index ends with), so the topics are one probe
-- each (a loose index scan) and a topic's oldest rows one range. The index is rebuilt in
-- place: no new index, so an insert costs what it did. Dropping and adding it in one
-- statement lets a migration interrupted after it run it again.
ALTER TABLE {{schema}}.outbox_messages
    DROP INDEX outbox_messages_held_back_idx,
    ADD INDEX outbox_messages_held_back_idx (held_back, ordering_key, ordering_seq, topic);
