package mysqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/store/storedriver"
)

// DeadlockRetried returns how many transactions the store ran again after a deadlock.
func DeadlockRetried() int64 { return deadlockRetried.Load() }

// UnparkHeadsSQL is the sweep's statement that finds each key's first parked row.
func (s *Store) UnparkHeadsSQL() string { return fmt.Sprintf(unparkHeadsSQL, s.messages) }

// ClaimSQL returns the two SELECTs with which the claim chooses its rows (delayed, then
// due at once), for EXPLAIN. Their one parameter is the limit.
func (s *Store) ClaimSQL() (delayed, immediate string) {
	return fmt.Sprintf(claimDelayedSQL, s.messages, s.pauses), fmt.Sprintf(claimImmediateSQL, s.messages, s.pauses)
}

// Claim takes up to limit due rows and leases them for lease, ordering keyed messages by
// the default rules.
func (s *Store) Claim(ctx context.Context, limit int, lease time.Duration) ([]storedriver.Claimed, error) {
	res, err := s.ClaimBatch(ctx, limit, lease, storedriver.OrderingRules{})
	return res.Claimed, err
}

// NextDueSQL returns the statement NextDue runs, for EXPLAIN.
func (s *Store) NextDueSQL() string { return fmt.Sprintf(nextDueSQL, s.messages) }

// MarkDispatched records that a workflow owns the claimed row: claimed → dispatched, only
// while the caller still holds the claim. ok is false when the row has moved on.
func (s *Store) MarkDispatched(ctx context.Context, id int64, token uuid.UUID) (ok bool, err error) {
	n, err := s.MarkDispatchedAll(ctx, []storedriver.Claimed{{ID: id, ClaimToken: token}})
	return n > 0, err
}

// ParkedTopicsSQL and ParkedOfTopicSQL are the statements with which the claim finds the
// rows it parked for their topic's limit of messages in flight, for EXPLAIN; the second
// takes a topic and a limit.
func (s *Store) ParkedTopicsSQL() string  { return fmt.Sprintf(parkedTopicsSQL, s.messages, s.pauses) }
func (s *Store) ParkedOfTopicSQL() string { return fmt.Sprintf(parkedOfTopicSQL, s.messages) }
