package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/outbox-go/outbox/store/storedriver"
)

// PauseTopic implements storedriver.Operations: it records the pause, which the next claim
// of every relay reads. Rows of the topic already handed over are not touched: their
// sends find the topic paused and wait.
func (s *Store) PauseTopic(ctx context.Context, topic, actor, reason string) (storedriver.TopicPause, bool, error) {
	if err := storedriver.ValidatePause(topic, actor, reason); err != nil {
		return storedriver.TopicPause{}, false, fmt.Errorf("pause topic: %w", err)
	}
	var (
		p        storedriver.TopicPause
		inserted bool
	)
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT IGNORE INTO `+s.pauses+` (topic, paused_by, reason) VALUES (?, ?, ?)`, topic, actor, reason)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		inserted = n > 0
		// A locking read: the row as committed, even one another caller inserted after
		// this transaction's snapshot.
		return tx.QueryRowContext(ctx, `SELECT topic, paused_at, paused_by, reason FROM `+s.pauses+` WHERE topic = ? LOCK IN SHARE MODE`, topic).
			Scan(&p.Topic, &p.PausedAt, &p.PausedBy, &p.Reason)
	})
	if err != nil {
		return storedriver.TopicPause{}, false, fmt.Errorf("pause topic %q: %w", topic, err)
	}
	return p, inserted, nil
}

// ResumeTopic implements storedriver.Operations: in one transaction it deletes the pause
// and unparks the topic's parked rows (a keyed one that its key still holds back is parked
// again by the next claim).
func (s *Store) ResumeTopic(ctx context.Context, topic string) (storedriver.TopicPause, bool, error) {
	var p storedriver.TopicPause
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT topic, paused_at, paused_by, reason FROM `+s.pauses+` WHERE topic = ? FOR UPDATE`, topic).
			Scan(&p.Topic, &p.PausedAt, &p.PausedBy, &p.Reason)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+s.pauses+` WHERE topic = ?`, topic); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE `+s.messages+` SET held_back = FALSE WHERE held_back = TRUE AND topic = ?`, topic)
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return storedriver.TopicPause{}, false, nil
	}
	if err != nil {
		return storedriver.TopicPause{}, false, fmt.Errorf("resume topic %q: %w", topic, err)
	}
	return p, true, nil
}

// PausedTopics implements storedriver.Operations.
func (s *Store) PausedTopics(ctx context.Context) ([]storedriver.TopicPause, error) {
	out, err := s.pausedTopics(ctx, s.db)
	if err != nil {
		return nil, fmt.Errorf("list paused topics: %w", err)
	}
	return out, nil
}

func (s *Store) pausedTopics(ctx context.Context, db interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}) ([]storedriver.TopicPause, error) {
	rows, err := db.QueryContext(ctx, `SELECT topic, paused_at, paused_by, reason FROM `+s.pauses+` ORDER BY topic`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storedriver.TopicPause
	for rows.Next() {
		var p storedriver.TopicPause
		if err := rows.Scan(&p.Topic, &p.PausedAt, &p.PausedBy, &p.Reason); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
