-- The outbox tables on MySQL 8.0+ and MariaDB 10.6+: what PostgreSQL's migrations 0001 to
-- 0010 make, in one migration. Migrate fills in the schema placeholder with the connection's
-- database (quoted) and the binary placeholder with a byte-order collation without
-- trailing-space padding: utf8mb4_0900_bin on MySQL, utf8mb4_nopad_bin on MariaDB
-- (utf8mb4_bin where neither exists, which ignores trailing spaces in comparisons). Topics,
-- ordering keys, idempotency keys and run IDs use it, so they compare byte by byte as
-- PostgreSQL's text does ('Order-1' and 'order-1' are two keys).
--
-- How it differs from PostgreSQL, and why:
--
-- * MySQL DDL is not transactional: each statement commits on its own. Migrate takes a
--   named lock (GET_LOCK) on a connection of its own, so concurrent migrations run one at
--   a time, and records in outbox_schema_migrations, after each statement, how many of the
--   migration's statements have run (statements_done); applied_at is set when all have. A
--   migration interrupted half-way resumes at its first statement not recorded. Each
--   statement here is also safe to run twice (CREATE TABLE IF NOT EXISTS with the indexes
--   inside it, DROP TRIGGER IF EXISTS before CREATE TRIGGER, the deployment row inserted
--   only when missing), for the moment between a statement and the record of it. A later
--   migration must keep each statement re-runnable the same way.
-- * No partial indexes. PostgreSQL's claim indexes hold only the rows waiting for a relay;
--   here the stored generated column claim_lane is 1 for a row due at once (pending or
--   claimed, no next_retry_at, not held back), 2 for a delayed one (next_retry_at set) and
--   NULL otherwise, and the claim reads outbox_messages_claim_idx (claim_lane,
--   next_retry_at, id): lane 1 in id order, lane 2 in next_retry_at order up to now. Sent
--   and held-back rows have no lane, so the claim costs the same however many the table
--   keeps. The other indexes lead with status where PostgreSQL's predicate names one.
-- * No NOTIFY: no notify triggers; the relays poll.
-- * Ordering numbers come from a counter row per key, outbox_ordering_keys (PostgreSQL's
--   0003 design, which 0006 replaced with an advisory lock and a sequence because of
--   serialization errors at REPEATABLE READ; InnoDB updates the latest row version at any
--   isolation level and raises none). The BEFORE INSERT trigger takes the key's next
--   number with INSERT ... ON DUPLICATE KEY UPDATE last_seq = LAST_INSERT_ID(last_seq + 1),
--   which keeps the counter row locked until the writer's transaction ends: writers of one
--   key serialise, and a key's ordering_seq order is its commit order, without gaps (a
--   rollback gives its number back). Plain-SQL writers get it too. The table keeps one
--   row per key ever used.
-- * No trigger may change the table it fires on (MySQL error 1442), so PostgreSQL's
--   release trigger (a keyed message sent, dead-lettered or discarded unparks the next
--   parked message of its key) is done by the store's methods that make those moves. A
--   row moved there by hand is unparked by the relays' periodic sweep (Unpark). The park
--   lock that PostgreSQL takes with pg_advisory_xact_lock is a row of
--   outbox_ordering_parks, locked with an upsert until the transaction ends.
-- * message_id is CHAR(36) with DEFAULT (UUID()), so plain-SQL writers may leave it out
--   (UUID() is version 1; Enqueue writes version 7). The other UUID columns are CHAR(36).
-- * payload and headers are JSON (on MariaDB a LONGTEXT checked with JSON_VALID; on MySQL
--   a binary JSON that stores numbers as doubles, which is why Validate refuses a number
--   beyond a double's range).
-- * Times are TIMESTAMP(6): stored in UTC whatever the writer's session time zone, read
--   in the session's zone (Open sets '+00:00'), microsecond precision. TIMESTAMP ends at
--   2038-01-19 03:14:07 UTC (MariaDB 11.5 moves that to 2106 on 64-bit servers); the
--   store writes and compares them with NOW(6), the database clock at the statement's
--   start (PostgreSQL's now() is the transaction's start). created_at is therefore the
--   INSERT's time rather than its transaction's start.
-- * CHECK constraints are PostgreSQL's (enforced since MySQL 8.0.16 and MariaDB 10.2).
-- * The archive tables are written out rather than made with CREATE TABLE ... LIKE,
--   which would copy the generated column, the unique keys and the CHECK constraints.

CREATE TABLE IF NOT EXISTS {{schema}}.outbox_messages (
    id              BIGINT       NOT NULL AUTO_INCREMENT,
    message_id      CHAR(36)     CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL DEFAULT (UUID()),
    topic           VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NOT NULL,
    payload         JSON         NOT NULL,
    headers         JSON         NULL,
    status          VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'pending',
    retry_times     INT          NOT NULL DEFAULT 0,
    max_retry_times INT          NULL,
    next_retry_at   TIMESTAMP(6) NULL DEFAULT NULL,
    ordering_key    VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NULL,
    ordering_seq    BIGINT       NULL,
    lease_until     TIMESTAMP(6) NULL DEFAULT NULL,
    claim_token     CHAR(36)     CHARACTER SET ascii COLLATE ascii_general_ci NULL,
    last_error      TEXT         NULL,
    redrive_count   INT          NOT NULL DEFAULT 0,
    dispatched_at   TIMESTAMP(6) NULL DEFAULT NULL,
    sent_at         TIMESTAMP(6) NULL DEFAULT NULL,
    created_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    held_back       BOOLEAN      NOT NULL DEFAULT FALSE,
    idempotency_key VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NULL,
    -- The claim's lane (see above): what PostgreSQL's partial claim indexes select.
    claim_lane      TINYINT GENERATED ALWAYS AS (
        CASE WHEN status IN ('pending', 'claimed') AND held_back = FALSE
             THEN CASE WHEN next_retry_at IS NULL THEN 1 ELSE 2 END END) STORED,

    PRIMARY KEY (id),
    CONSTRAINT outbox_messages_message_id_key UNIQUE KEY outbox_messages_message_id_key (message_id),
    -- A key is unique among the rows the table holds (NULLs do not conflict).
    CONSTRAINT outbox_messages_idempotency_key_idx UNIQUE KEY outbox_messages_idempotency_key_idx (idempotency_key),
    -- The claim: lane 1 by id, lane 2 by next_retry_at.
    INDEX outbox_messages_claim_idx (claim_lane, next_retry_at, id),
    -- The earlier messages of a key, by status: the claim's "nothing earlier is
    -- undelivered" test reads the pending, claimed, dispatched and dead ones only.
    INDEX outbox_messages_ordering_idx (ordering_key, status, ordering_seq),
    -- Parked rows by key, for the release and the sweep.
    INDEX outbox_messages_held_back_idx (held_back, ordering_key, ordering_seq),
    -- Retention of sent and discarded rows (a sent row's updated_at is its sent_at),
    -- reconciliation of dispatched rows, stats. Every row enters every index here (no
    -- partial indexes), so each one costs every insert: NextDue reads the claim index, and
    -- sent rows have no index of their own.
    INDEX outbox_messages_updated_idx (status, updated_at),

    CONSTRAINT outbox_messages_message_id_check
        CHECK (message_id REGEXP '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    CONSTRAINT outbox_messages_status_check
        CHECK (status IN ('pending', 'claimed', 'dispatched', 'sent', 'dead', 'discarded')),
    CONSTRAINT outbox_messages_topic_check
        CHECK (CHAR_LENGTH(topic) BETWEEN 1 AND 200),
    CONSTRAINT outbox_messages_retry_times_check
        CHECK (retry_times >= 0),
    CONSTRAINT outbox_messages_max_retry_times_check
        CHECK (max_retry_times BETWEEN 0 AND 100),
    CONSTRAINT outbox_messages_redrive_count_check
        CHECK (redrive_count >= 0),
    CONSTRAINT outbox_messages_claim_check
        CHECK (status <> 'claimed' OR (lease_until IS NOT NULL AND claim_token IS NOT NULL)),
    CONSTRAINT outbox_messages_ordering_key_check
        CHECK (CHAR_LENGTH(ordering_key) BETWEEN 1 AND 200)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS {{schema}}.outbox_dead_letters (
    id                 BIGINT       NOT NULL AUTO_INCREMENT,
    message_id         CHAR(36)     CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL,
    workflow_id        TEXT         NOT NULL,
    run_id             VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {{binary}} NOT NULL,
    topic              VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NOT NULL,
    payload            JSON         NOT NULL,
    headers            JSON         NULL,
    attempts           INT          NOT NULL,
    last_error         TEXT         NOT NULL,
    message_created_at TIMESTAMP(6) NULL DEFAULT NULL,
    dead_lettered_at   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    redriven_at        TIMESTAMP(6) NULL DEFAULT NULL,
    discarded_at       TIMESTAMP(6) NULL DEFAULT NULL,
    redriven_by        TEXT         NULL,
    discarded_by       TEXT         NULL,

    PRIMARY KEY (id),
    CONSTRAINT outbox_dead_letters_message_run_key UNIQUE KEY outbox_dead_letters_message_run_key (message_id, run_id),
    INDEX outbox_dead_letters_topic_idx (topic, dead_lettered_at),
    -- Open dead letters (neither redriven nor discarded) by time, for dlq list and stats.
    INDEX outbox_dead_letters_open_idx (redriven_at, discarded_at, dead_lettered_at),
    INDEX outbox_dead_letters_at_idx (dead_lettered_at),
    -- Retention of discarded dead letters.
    INDEX outbox_dead_letters_discarded_idx (discarded_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Every operator action on a message, and reconciliation's repairs, oldest first.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_audit (
    id             BIGINT       NOT NULL AUTO_INCREMENT,
    message_id     CHAR(36)     CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL,
    dead_letter_id BIGINT       NULL,
    action         VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    actor          TEXT         NOT NULL,
    `at`           TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    detail         TEXT         NULL,

    PRIMARY KEY (id),
    INDEX outbox_audit_message_idx (message_id, `at`),
    INDEX outbox_audit_action_idx (action, `at`),
    CONSTRAINT outbox_audit_action_check CHECK (action IN ('redrive', 'discard', 'reconcile'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Where retention moves rows when archiving is configured: the same columns (no
-- claim_lane), no constraints beyond the key.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_messages_archive (
    id              BIGINT       NOT NULL,
    message_id      CHAR(36)     CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL,
    topic           VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NOT NULL,
    payload         JSON         NOT NULL,
    headers         JSON         NULL,
    status          VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    retry_times     INT          NOT NULL DEFAULT 0,
    max_retry_times INT          NULL,
    next_retry_at   TIMESTAMP(6) NULL DEFAULT NULL,
    ordering_key    VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NULL,
    ordering_seq    BIGINT       NULL,
    lease_until     TIMESTAMP(6) NULL DEFAULT NULL,
    claim_token     CHAR(36)     CHARACTER SET ascii COLLATE ascii_general_ci NULL,
    last_error      TEXT         NULL,
    redrive_count   INT          NOT NULL DEFAULT 0,
    dispatched_at   TIMESTAMP(6) NULL DEFAULT NULL,
    sent_at         TIMESTAMP(6) NULL DEFAULT NULL,
    created_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    held_back       BOOLEAN      NOT NULL DEFAULT FALSE,
    idempotency_key VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NULL,
    archived_at     TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS {{schema}}.outbox_dead_letters_archive (
    id                 BIGINT       NOT NULL,
    message_id         CHAR(36)     CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL,
    workflow_id        TEXT         NOT NULL,
    run_id             VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {{binary}} NOT NULL,
    topic              VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NOT NULL,
    payload            JSON         NOT NULL,
    headers            JSON         NULL,
    attempts           INT          NOT NULL,
    last_error         TEXT         NOT NULL,
    message_created_at TIMESTAMP(6) NULL DEFAULT NULL,
    dead_lettered_at   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    redriven_at        TIMESTAMP(6) NULL DEFAULT NULL,
    discarded_at       TIMESTAMP(6) NULL DEFAULT NULL,
    redriven_by        TEXT         NULL,
    discarded_by       TEXT         NULL,
    archived_at        TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Per-key ordering: the last number each key gave (see above).
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_ordering_keys (
    ordering_key VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NOT NULL,
    last_seq     BIGINT       NOT NULL,
    PRIMARY KEY (ordering_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- The park locks: a transaction that parks or releases a key's rows first locks the
-- key's row here (see above).
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_ordering_parks (
    ordering_key VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{binary}} NOT NULL,
    PRIMARY KEY (ordering_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

DROP TRIGGER IF EXISTS {{schema}}.outbox_messages_order;

DELIMITER //
CREATE TRIGGER {{schema}}.outbox_messages_order
    BEFORE INSERT ON {{schema}}.outbox_messages
    FOR EACH ROW
BEGIN
    IF NEW.ordering_key IS NULL THEN
        SET NEW.ordering_seq = NULL;
    ELSE
        INSERT INTO {{schema}}.outbox_ordering_keys (ordering_key, last_seq)
        VALUES (NEW.ordering_key, LAST_INSERT_ID(1))
        ON DUPLICATE KEY UPDATE last_seq = LAST_INSERT_ID(last_seq + 1);
        SET NEW.ordering_seq = LAST_INSERT_ID();
    END IF;
END//
DELIMITER ;

-- The deployment: one row that names this outbox (its database) with an ID of its own,
-- and the Temporal task queue its workflows run on (see PostgreSQL's 0010).
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_deployment (
    singleton     BOOLEAN      NOT NULL DEFAULT TRUE,
    deployment_id CHAR(36)     CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL DEFAULT (UUID()),
    task_queue    TEXT         NULL,
    created_at    TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at    TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (singleton),
    CONSTRAINT outbox_deployment_singleton_check CHECK (singleton),
    CONSTRAINT outbox_deployment_task_queue_check CHECK (task_queue <> '')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

INSERT INTO {{schema}}.outbox_deployment (singleton)
SELECT TRUE FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_deployment);
