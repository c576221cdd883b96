package storedriver

import (
	"cmp"
	"context"
	"fmt"
	"time"
)

// DefaultPurgeLimit is the number of rows one purge batch removes when
// PurgeOptions.Limit is zero; MaxPurgeLimit is the most it may remove.
const (
	DefaultPurgeLimit = 1000
	MaxPurgeLimit     = 100000
)

// MinRetentionAge is the shortest SentAfter and DiscardedAfter: a shorter one would remove
// rows that a relay, a worker or an operator may still be looking at.
const MinRetentionAge = time.Minute

// PurgeOptions says which rows retention removes and how.
type PurgeOptions struct {
	// SentAfter is the age (since sent_at, by the database clock) after which sent
	// messages are removed. Required: at least MinRetentionAge.
	SentAfter time.Duration
	// DiscardedAfter is the age (since the message was discarded, by the database clock)
	// after which discarded messages and their dead letters are removed, as are dead
	// letters discarded that long ago whose message row no longer exists. Required: at
	// least MinRetentionAge.
	DiscardedAfter time.Duration
	// Archive moves the rows to outbox_messages_archive and outbox_dead_letters_archive
	// instead of deleting them.
	Archive bool
	// Limit caps the messages (and orphaned dead letters) one batch removes. Defaults to
	// DefaultPurgeLimit (1000).
	Limit int
}

// WithDefaults returns o with a zero Limit set to DefaultPurgeLimit.
func (o PurgeOptions) WithDefaults() PurgeOptions {
	o.Limit = cmp.Or(o.Limit, DefaultPurgeLimit)
	return o
}

// Validate reports the first field of o (after WithDefaults) that is out of range.
func (o PurgeOptions) Validate() error {
	switch {
	case o.SentAfter < MinRetentionAge:
		return fmt.Errorf("retention: sent_after must be at least %s, got %s", MinRetentionAge, o.SentAfter)
	case o.DiscardedAfter < MinRetentionAge:
		return fmt.Errorf("retention: discarded_after must be at least %s, got %s", MinRetentionAge, o.DiscardedAfter)
	case o.Limit < 1 || o.Limit > MaxPurgeLimit:
		return fmt.Errorf("retention: limit must be between 1 and %d, got %d", MaxPurgeLimit, o.Limit)
	}
	return nil
}

// PurgeResult counts the rows a purge removed (deleted, or moved to the archive tables).
type PurgeResult struct {
	// SentMessages is the number of sent messages removed.
	SentMessages int64
	// DiscardedMessages is the number of discarded messages removed.
	DiscardedMessages int64
	// DeadLetters is the number of dead letters removed: those of the removed messages
	// (a sent message keeps the dead letters of its runs before a redrive) and discarded
	// ones whose message row was already gone.
	DeadLetters int64
	// Batches is the number of batches (transactions) run.
	Batches int
	// More reports that the last batch removed as many rows as its limit, so more may be
	// due. Purge runs batches until it is false.
	More bool
}

// Add adds the counts of r to p.
func (p *PurgeResult) Add(r PurgeResult) {
	p.SentMessages += r.SentMessages
	p.DiscardedMessages += r.DiscardedMessages
	p.DeadLetters += r.DeadLetters
	p.Batches += r.Batches
	p.More = r.More
}

// PurgeError is a failure of a purge with opts, as every store reports it.
func PurgeError(opts PurgeOptions, err error) error {
	verb := "delete"
	if opts.Archive {
		verb = "archive"
	}
	return fmt.Errorf("retention: %s old rows: %w", verb, err)
}

// PurgeAll is a store's Purge: it runs batch until a batch is not full and returns the
// total, or, when ctx ends between batches, what was removed so far and ctx's error.
func PurgeAll(ctx context.Context, batch func(context.Context, PurgeOptions) (PurgeResult, error), opts PurgeOptions) (PurgeResult, error) {
	var total PurgeResult
	for {
		if err := ctx.Err(); err != nil {
			return total, PurgeError(opts, err)
		}
		res, err := batch(ctx, opts)
		if err != nil {
			return total, err
		}
		total.Add(res)
		if !res.More {
			return total, nil
		}
	}
}
