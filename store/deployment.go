package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-go/outbox/store/storedriver"
)

// Deployment returns the identity of this outbox (migration 0010): its deployment ID, made
// once when the schema was migrated, and the task queue recorded for its workflows (empty
// until outbox migrate, a relay or a worker records one, see RecordTaskQueue). The relay
// puts the ID in every workflow's input, and the activities and the workflow refuse a
// message whose ID is another deployment's: a task queue belongs to one outbox database.
func (s *Store) Deployment(ctx context.Context) (id uuid.UUID, taskQueue string, err error) {
	var tq *string
	err = s.db.QueryRow(ctx, `SELECT deployment_id, task_queue FROM `+s.deployment).Scan(&id, &tq)
	if err != nil {
		return uuid.Nil, "", deploymentError(err)
	}
	s.deploymentID.Store(&id)
	if tq != nil {
		taskQueue = *tq
	}
	return id, taskQueue, nil
}

// DeploymentID is the deployment ID of Deployment, read from the database once and then
// remembered (it never changes).
func (s *Store) DeploymentID(ctx context.Context) (uuid.UUID, error) {
	if id := s.deploymentID.Load(); id != nil {
		return *id, nil
	}
	id, _, err := s.Deployment(ctx)
	return id, err
}

// RecordTaskQueue records taskQueue as the deployment's task queue when none is recorded
// yet, and returns the deployment ID and the task queue recorded (taskQueue, or the one an
// earlier call recorded). The caller compares it with its own: a relay whose task queue
// differs would start workflows that only another outbox's workers poll.
func (s *Store) RecordTaskQueue(ctx context.Context, taskQueue string) (id uuid.UUID, recorded string, err error) {
	if taskQueue == "" {
		return uuid.Nil, "", errors.New("record task queue: the task queue is empty")
	}
	_, err = s.db.Exec(ctx, `UPDATE `+s.deployment+` SET task_queue = $1, updated_at = now() WHERE task_queue IS NULL`, taskQueue)
	if err != nil {
		return uuid.Nil, "", deploymentError(err)
	}
	return s.Deployment(ctx)
}

// MoveTaskQueue records taskQueue as the deployment's task queue, replacing the one
// recorded. Runs already started stay on the old task queue: let them finish (or keep a
// worker on it) before the move.
func (s *Store) MoveTaskQueue(ctx context.Context, taskQueue string) error {
	if taskQueue == "" {
		return errors.New("move task queue: the task queue is empty")
	}
	if _, err := s.db.Exec(ctx, `UPDATE `+s.deployment+` SET task_queue = $1, updated_at = now()`, taskQueue); err != nil {
		return deploymentError(err)
	}
	return nil
}

// PublishPolicy implements storedriver.Delivery: it records p on the deployment's row
// unless the policy recorded there is newer (see storedriver.PublishedPolicy), and returns
// the policy in effect after the call. Two publishers at once take the row in turn, and
// the second is compared with what the first recorded.
func (s *Store) PublishPolicy(ctx context.Context, p PublishedPolicy) (PublishedPolicy, error) {
	if err := storedriver.ValidatePublishedPolicy(p); err != nil {
		return PublishedPolicy{}, fmt.Errorf("publish the delivery policy: %w", err)
	}
	_, err := s.db.Exec(ctx, `UPDATE `+s.deployment+`
SET policy = $1::jsonb, policy_as_of = $2, policy_by = $3, policy_published_at = now()
WHERE policy_as_of IS NULL OR policy_as_of < $2 OR (policy_as_of = $2 AND policy <> $1::jsonb)`,
		string(p.Policies), storedriver.PolicyTime(p.AsOf), p.By)
	if err != nil {
		return PublishedPolicy{}, fmt.Errorf("publish the delivery policy: %w", deploymentError(err))
	}
	return s.PublishedPolicy(ctx)
}

// PublishedPolicy implements storedriver.Delivery.
func (s *Store) PublishedPolicy(ctx context.Context) (PublishedPolicy, error) {
	var (
		doc     []byte
		asOf    *time.Time
		by      *string
		publish *time.Time
	)
	err := s.db.QueryRow(ctx, `SELECT policy::text, policy_as_of, policy_by, policy_published_at FROM `+s.deployment).
		Scan(&doc, &asOf, &by, &publish)
	if err != nil {
		return PublishedPolicy{}, deploymentError(err)
	}
	if doc == nil || asOf == nil || by == nil || publish == nil {
		return PublishedPolicy{}, nil
	}
	return PublishedPolicy{Policies: doc, AsOf: asOf.UTC(), By: *by, PublishedAt: publish.UTC()}, nil
}

// deploymentError explains a missing deployment table (the schema predates migration 0010)
// or a missing column of it (0014).
func deploymentError(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01":
		return storedriver.NotMigrated(fmt.Errorf("read the outbox deployment: %w (the schema predates migration 0010: run outbox migrate)", err))
	case errors.As(err, &pgErr) && pgErr.Code == "42703":
		return storedriver.NotMigrated(fmt.Errorf("read the outbox deployment: %w (the schema predates migration 0014: run outbox migrate)", err))
	case errors.Is(err, pgx.ErrNoRows):
		return storedriver.NotMigrated(errors.New("read the outbox deployment: its row is missing from outbox_deployment (run outbox migrate)"))
	}
	return fmt.Errorf("read the outbox deployment: %w", err)
}

// IsDeploymentMissing reports whether err says the schema has no deployment (it predates
// migration 0010).
func IsDeploymentMissing(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// Kind implements Delivery.
func (s *Store) Kind() string { return "postgres" }

// Answered implements storedriver.Answerer: err is PostgreSQL's answer (a *pgconn.PgError).
func (s *Store) Answered(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

var (
	_ storedriver.Answerer = (*Store)(nil)
	_ Driver               = (*Store)(nil)
	_ Notifier             = (*Store)(nil)
)
