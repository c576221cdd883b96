package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// What the tests of this package and of others use beside the Driver interface.

// ClaimSQL returns the claim statement for this store's table, for EXPLAIN. Its
// parameters are the claim token, the lease in seconds, the limit and orderingArgs.
func (s *Store) ClaimSQL() string { return fmt.Sprintf(claimSQL, s.messages, s.pauses) }

// UnparkLimitedSQL is the statement that unparks rows parked for their topic's limit of
// messages in flight, for EXPLAIN; its one parameter is the limit.
func (s *Store) UnparkLimitedSQL() string { return fmt.Sprintf(unparkLimitedSQL, s.messages, s.pauses) }

// AnyParkedSQL is the probe that unparking runs before UnparkLimitedSQL, for EXPLAIN.
func (s *Store) AnyParkedSQL() string { return fmt.Sprintf(anyParkedSQL, s.messages) }

// ParkKeysSQL, RecheckParkedSQL and UnparkSQL are the statements that park and unpark
// keyed rows, for EXPLAIN. The first two take a key or ID list, then orderingArgs; the
// last orderingArgs alone.
func (s *Store) ParkKeysSQL() string      { return fmt.Sprintf(parkKeysSQL, s.messages) }
func (s *Store) RecheckParkedSQL() string { return fmt.Sprintf(recheckParkedSQL, s.messages, s.pauses) }
func (s *Store) UnparkSQL() string        { return fmt.Sprintf(unparkSQL, s.messages, s.pauses) }

// Claim takes up to limit due rows (pending rows whose next_retry_at has passed, and
// claimed rows whose lease has expired) and leases them for lease, ordering keyed
// messages by the default rules.
func (s *Store) Claim(ctx context.Context, limit int, lease time.Duration) ([]Claimed, error) {
	return s.ClaimOrdered(ctx, limit, lease, OrderingRules{})
}

// ClaimOrdered is Claim with the ordering rules of the configured topics.
func (s *Store) ClaimOrdered(ctx context.Context, limit int, lease time.Duration, rules OrderingRules) ([]Claimed, error) {
	res, err := s.ClaimBatch(ctx, limit, lease, rules)
	return res.Claimed, err
}

// MarkDispatched records that a workflow owns the claimed row: claimed → dispatched, only
// while the caller still holds the claim. ok is false when the row has moved on (its
// workflow already finished, or the lease expired and another relay took it).
func (s *Store) MarkDispatched(ctx context.Context, id int64, token uuid.UUID) (ok bool, err error) {
	n, err := s.MarkDispatchedAll(ctx, []Claimed{{ID: id, ClaimToken: token}})
	return n > 0, err
}

// NextDueSQL returns the statement NextDue runs, for EXPLAIN.
func (s *Store) NextDueSQL() string { return fmt.Sprintf(nextDueSQL, s.messages) }

// PurgeSentSQL and PurgeDiscardedSQL return the statements PurgeBatch runs for sent and
// discarded messages, for EXPLAIN.
func (s *Store) PurgeSentSQL() string      { return s.purgeSQL(false).sent }
func (s *Store) PurgeDiscardedSQL() string { return s.purgeSQL(false).discarded }
