package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/store/storedriver"
)

// Deployment returns the identity of this outbox: its deployment ID, made once when the
// database was migrated, and the task queue recorded for its workflows (empty until outbox
// migrate, a relay or a worker records one, see RecordTaskQueue), as package store does.
func (s *Store) Deployment(ctx context.Context) (id uuid.UUID, taskQueue string, err error) {
	var tq sql.NullString
	err = s.db.QueryRowContext(ctx, `SELECT deployment_id, task_queue FROM `+s.deployment).Scan(&id, &tq)
	if err != nil {
		return uuid.Nil, "", deploymentError(err)
	}
	s.deploymentID.Store(&id)
	return id, tq.String, nil
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
// earlier call recorded).
func (s *Store) RecordTaskQueue(ctx context.Context, taskQueue string) (id uuid.UUID, recorded string, err error) {
	if taskQueue == "" {
		return uuid.Nil, "", errors.New("record task queue: the task queue is empty")
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE `+s.deployment+` SET task_queue = ?, updated_at = NOW(6) WHERE task_queue IS NULL`, taskQueue); err != nil {
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
	if _, err := s.db.ExecContext(ctx, `UPDATE `+s.deployment+` SET task_queue = ?, updated_at = NOW(6)`, taskQueue); err != nil {
		return deploymentError(err)
	}
	return nil
}

// PublishPolicy implements storedriver.Delivery: it records p on the deployment's row
// unless the policy recorded there is newer (see storedriver.PublishedPolicy), and returns
// the policy in effect after the call, as package store does. The UPDATE reads the row as
// committed, so two publishers at once are compared in turn.
func (s *Store) PublishPolicy(ctx context.Context, p storedriver.PublishedPolicy) (storedriver.PublishedPolicy, error) {
	if err := storedriver.ValidatePublishedPolicy(p); err != nil {
		return storedriver.PublishedPolicy{}, fmt.Errorf("publish the delivery policy: %w", err)
	}
	doc, asOf := string(p.Policies), storedriver.PolicyTime(p.AsOf)
	_, err := s.db.ExecContext(ctx, `UPDATE `+s.deployment+`
SET policy = ?, policy_as_of = ?, policy_by = ?, policy_published_at = NOW(6)
WHERE policy_as_of IS NULL OR policy_as_of < ? OR (policy_as_of = ? AND NOT (policy <=> ?))`,
		doc, asOf, p.By, asOf, asOf, doc)
	if err != nil {
		return storedriver.PublishedPolicy{}, fmt.Errorf("publish the delivery policy: %w", deploymentError(err))
	}
	return s.PublishedPolicy(ctx)
}

// PublishedPolicy implements storedriver.Delivery.
func (s *Store) PublishedPolicy(ctx context.Context) (storedriver.PublishedPolicy, error) {
	var (
		doc, by         sql.NullString
		asOf, published sql.NullTime
	)
	err := s.db.QueryRowContext(ctx, `SELECT policy, policy_as_of, policy_by, policy_published_at FROM `+s.deployment).
		Scan(&doc, &asOf, &by, &published)
	if err != nil {
		return storedriver.PublishedPolicy{}, deploymentError(err)
	}
	if !doc.Valid || !asOf.Valid || !by.Valid || !published.Valid {
		return storedriver.PublishedPolicy{}, nil
	}
	return storedriver.PublishedPolicy{Policies: json.RawMessage(doc.String), AsOf: asOf.Time.UTC(), By: by.String,
		PublishedAt: published.Time.UTC()}, nil
}

// deploymentError explains a missing deployment table or row.
func deploymentError(err error) error {
	switch {
	case isErrNumber(err, errNoSuchTable):
		return storedriver.NotMigrated(fmt.Errorf("read the outbox deployment: %w (%w)", err, errMissingTables))
	case isErrNumber(err, errBadField):
		return storedriver.NotMigrated(fmt.Errorf("read the outbox deployment: %w (the database predates migration 0005: run outbox migrate)", err))
	case errors.Is(err, sql.ErrNoRows):
		return storedriver.NotMigrated(errors.New("read the outbox deployment: its row is missing from outbox_deployment (run outbox migrate)"))
	}
	return fmt.Errorf("read the outbox deployment: %w", err)
}

// IsDeploymentMissing reports whether err says the database has no outbox tables (it was
// never migrated), as store.IsDeploymentMissing does for PostgreSQL.
func IsDeploymentMissing(err error) bool {
	return errors.Is(err, errMissingTables) || isErrNumber(err, errNoSuchTable)
}
