package storedriver

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// PublishedPolicy is every topic's delivery policy as one process's configuration sets
// it, recorded on the deployment's row so that the relays and the workers of one outbox
// follow the newest configuration, whichever process read it first. A relay freezes the
// policy in effect into each run it starts.
//
// A publication replaces the recorded one when its AsOf is later, or when AsOf is the
// same and the policies differ (then the later publication wins, as it must when every
// file carries one fixed time, such as an image built with a fixed SOURCE_DATE_EPOCH). A
// process restarted with an older file publishes nothing and follows the newer policy.
type PublishedPolicy struct {
	// Policies is the policies' JSON document (workflows.Policies); nil when none was
	// published.
	Policies json.RawMessage
	// AsOf is when the configuration last changed: its file's modification time.
	AsOf time.Time
	// By names the process that published it and its file, for logs and operators.
	By string
	// PublishedAt is when it was recorded, by the database clock.
	PublishedAt time.Time
}

// MaxPublishedBy is the longest PublishedPolicy.By a store takes, in bytes.
const MaxPublishedBy = 500

// ValidatePublishedPolicy reports what is wrong with p before a store records it.
func ValidatePublishedPolicy(p PublishedPolicy) error {
	switch {
	case len(p.Policies) == 0 || !json.Valid(p.Policies) || p.Policies[0] != '{':
		return fmt.Errorf("policies must be a JSON object, got %s", quoteShort(string(p.Policies)))
	case p.AsOf.IsZero():
		return fmt.Errorf("as of must be the time the configuration last changed, got the zero time")
	case len(p.By) > MaxPublishedBy || strings.ContainsRune(p.By, 0) || !utf8.ValidString(p.By) || strings.TrimSpace(p.By) == "":
		return fmt.Errorf("by must be 1 to %d bytes of text without NUL naming the process and its file, got %s", MaxPublishedBy, quoteShort(p.By))
	}
	return nil
}

// PolicyTime is AsOf as every store records it: to the microsecond, in UTC.
func PolicyTime(t time.Time) time.Time { return t.Truncate(time.Microsecond).UTC() }
