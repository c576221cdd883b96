package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-go/outbox/store/storedriver"
)

// PauseTopic implements Operations: it records the pause, which the next claim of every
// relay reads. Rows of the topic already handed over are not touched: their sends find the
// topic paused and wait.
func (s *Store) PauseTopic(ctx context.Context, topic, actor, reason string) (TopicPause, bool, error) {
	if err := storedriver.ValidatePause(topic, actor, reason); err != nil {
		return TopicPause{}, false, fmt.Errorf("pause topic: %w", err)
	}
	var p TopicPause
	var inserted bool
	// A pause that another caller commits during the statement is not in its snapshot:
	// the second try sees it.
	err := pgx.ErrNoRows
	for try := 0; try < 2 && errors.Is(err, pgx.ErrNoRows); try++ {
		err = s.db.QueryRow(ctx, `WITH ins AS (
    INSERT INTO `+s.pauses+` (topic, paused_by, reason) VALUES ($1, $2, $3)
    ON CONFLICT (topic) DO NOTHING
    RETURNING topic, paused_at, paused_by, reason)
SELECT topic, paused_at, paused_by, reason, true FROM ins
UNION ALL
SELECT topic, paused_at, paused_by, reason, false FROM `+s.pauses+` WHERE topic = $1 AND NOT EXISTS (SELECT 1 FROM ins)`,
			topic, actor, reason).Scan(&p.Topic, &p.PausedAt, &p.PausedBy, &p.Reason, &inserted)
	}
	if err != nil {
		return TopicPause{}, false, fmt.Errorf("pause topic %q: %w", topic, err)
	}
	return p, inserted, nil
}

// ResumeTopic implements Operations: in one transaction it deletes the pause, unparks
// the topic's parked rows (a keyed one that its key still holds back is parked again by
// the next claim) and wakes the relays.
func (s *Store) ResumeTopic(ctx context.Context, topic string) (TopicPause, bool, error) {
	var p TopicPause
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `DELETE FROM `+s.pauses+` WHERE topic = $1 RETURNING topic, paused_at, paused_by, reason`, topic).
			Scan(&p.Topic, &p.PausedAt, &p.PausedBy, &p.Reason)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+s.messages+` SET held_back = false WHERE held_back AND topic = $1`, topic); err != nil {
			return err
		}
		return s.wake(ctx, tx)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return TopicPause{}, false, nil
	}
	if err != nil {
		return TopicPause{}, false, fmt.Errorf("resume topic %q: %w", topic, err)
	}
	return p, true, nil
}

// PausedTopics implements Operations.
func (s *Store) PausedTopics(ctx context.Context) ([]TopicPause, error) {
	rows, err := s.db.Query(ctx, `SELECT topic, paused_at, paused_by, reason FROM `+s.pauses+` ORDER BY topic`)
	if err != nil {
		return nil, fmt.Errorf("list paused topics: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanPause)
	if err != nil {
		return nil, fmt.Errorf("list paused topics: %w", err)
	}
	return out, nil
}

func scanPause(r pgx.CollectableRow) (TopicPause, error) {
	var p TopicPause
	err := r.Scan(&p.Topic, &p.PausedAt, &p.PausedBy, &p.Reason)
	return p, err
}
