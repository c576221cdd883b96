package store

import (
	"context"
	"io/fs"

	"github.com/outbox-go/outbox/store/storedriver"
)

// The names below are package storedriver's, what every store shares (see its
// documentation), under this package's name, so code on PostgreSQL imports this package
// alone.

// The interfaces of a store, one per audience.
type (
	Delivery   = storedriver.Delivery
	Operations = storedriver.Operations
	Driver     = storedriver.Driver
	Notifier   = storedriver.Notifier
)

// What a message is, and what business code gets back.
type (
	Message         = storedriver.Message
	Enqueued        = storedriver.Enqueued
	ValidationError = storedriver.ValidationError
	Status          = storedriver.Status
)

// The rows and results of the delivery machinery and the operators' commands.
type (
	Row                    = storedriver.Row
	Claimed                = storedriver.Claimed
	BatchTake              = storedriver.BatchTake
	ClaimResult            = storedriver.ClaimResult
	OrderingRules          = storedriver.OrderingRules
	Sent                   = storedriver.Sent
	Dispatched             = storedriver.Dispatched
	ReconcileOutcome       = storedriver.ReconcileOutcome
	DeadLetter             = storedriver.DeadLetter
	DeadLetterRecord       = storedriver.DeadLetterRecord
	DeadLetterFilter       = storedriver.DeadLetterFilter
	NotDeadError           = storedriver.NotDeadError
	DeadLetterChangedError = storedriver.DeadLetterChangedError
	AuditEntry             = storedriver.AuditEntry
	Redriven               = storedriver.Redriven
	Stats                  = storedriver.Stats
	TopicBacklog           = storedriver.TopicBacklog
	TopicPause             = storedriver.TopicPause
	PublishedPolicy        = storedriver.PublishedPolicy
	PurgeOptions           = storedriver.PurgeOptions
	PurgeResult            = storedriver.PurgeResult
	Migration              = storedriver.Migration
)

// Message statuses.
const (
	StatusPending    = storedriver.StatusPending
	StatusClaimed    = storedriver.StatusClaimed
	StatusDispatched = storedriver.StatusDispatched
	StatusSent       = storedriver.StatusSent
	StatusDead       = storedriver.StatusDead
	StatusDiscarded  = storedriver.StatusDiscarded
)

// Reconcile outcomes.
const (
	ReconcileRunning         = storedriver.ReconcileRunning
	ReconcileRecordedSent    = storedriver.ReconcileRecordedSent
	ReconcileHandedOverAgain = storedriver.ReconcileHandedOverAgain
)

// Limits.
const (
	DefaultMaxPayloadBytes = storedriver.DefaultMaxPayloadBytes
	HardMaxPayloadBytes    = storedriver.HardMaxPayloadBytes
	MaxRetryTimesLimit     = storedriver.MaxRetryTimesLimit
	MaxHeadersBytes        = storedriver.MaxHeadersBytes
	MaxErrorTextBytes      = storedriver.MaxErrorTextBytes
	DefaultPurgeLimit      = storedriver.DefaultPurgeLimit
	MaxPurgeLimit          = storedriver.MaxPurgeLimit
	MinRetentionAge        = storedriver.MinRetentionAge
)

var (
	// Statuses lists every status in the order a message moves through them.
	Statuses = storedriver.Statuses
	// TopicPattern is the form a topic must have.
	TopicPattern = storedriver.TopicPattern
	// ErrNotFound is returned when a message or dead letter does not exist.
	ErrNotFound = storedriver.ErrNotFound
	// ErrNotMigrated is what an error wraps when the database lacks the outbox's
	// migrations (see storedriver.ErrNotMigrated).
	ErrNotMigrated = storedriver.ErrNotMigrated
	// ErrOrderingDeadlock is what an Enqueue error wraps when the database aborted the
	// transaction because it and another one enqueued the same ordering keys in opposite
	// orders (see storedriver.ErrOrderingDeadlock).
	ErrOrderingDeadlock = storedriver.ErrOrderingDeadlock
)

// ValidatePayload is storedriver.ValidatePayload.
func ValidatePayload(p []byte, maxBytes int) error { return storedriver.ValidatePayload(p, maxBytes) }

// HeadersSize is storedriver.HeadersSize.
func HeadersSize(h map[string]string) int { return storedriver.HeadersSize(h) }

// PayloadSize is storedriver.PayloadSize.
func PayloadSize(p []byte) int { return storedriver.PayloadSize(p) }

// EncodedPayloadSize is storedriver.EncodedPayloadSize.
func EncodedPayloadSize(p []byte) int { return storedriver.EncodedPayloadSize(p) }

// PayloadSizes is storedriver.PayloadSizes.
func PayloadSizes(p []byte) (compact, encoded int) { return storedriver.PayloadSizes(p) }

// ParseHeaders is storedriver.ParseHeaders.
func ParseHeaders(data []byte) map[string]string { return storedriver.ParseHeaders(data) }

// StorableText is storedriver.StorableText.
func StorableText(s string) string { return storedriver.StorableText(s) }

// ReadMigrations is storedriver.ReadMigrations.
func ReadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	return storedriver.ReadMigrations(fsys, dir)
}

// PurgeError is storedriver.PurgeError.
func PurgeError(opts PurgeOptions, err error) error { return storedriver.PurgeError(opts, err) }

// PurgeAll is storedriver.PurgeAll.
func PurgeAll(ctx context.Context, batch func(context.Context, PurgeOptions) (PurgeResult, error), opts PurgeOptions) (PurgeResult, error) {
	return storedriver.PurgeAll(ctx, batch, opts)
}
