package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/storedriver"
)

// testEnqueue pins the business code's one call: a committed message reads back as it
// was enqueued, a rolled-back one is not there, and an invalid one is refused with a
// *storedriver.ValidationError before anything is written.
func testEnqueue(t *testing.T, h Harness) {
	t.Run("CommittedIsReadable", func(t *testing.T) {
		e := newEnv(t, h)
		retries := 2
		payload := `{"id": 1, "note": "ünïcödé \" \\ 😀", "items": [1, 2.5, null, true]}`
		res := e.enqueue(
			storedriver.Message{Topic: "order.created", Payload: json.RawMessage(payload),
				Headers: map[string]string{"x-tenant": "acme", "x-quote": `it's "q"`}, MaxRetryTimes: &retries},
			msg("order.paid", `"a string"`),
		)
		require.Len(t, res, 2)
		require.NotEqual(t, uuid.Nil, res[0].MessageID)
		require.NotEqual(t, res[0].MessageID, res[1].MessageID)
		require.False(t, res[0].Duplicate)
		require.Zero(t, res[0].OrderingSeq, "no ordering key, no sequence number")

		row := e.get(res[0].MessageID)
		require.Equal(t, res[0].MessageID, row.MessageID)
		require.Equal(t, "order.created", row.Topic)
		require.JSONEq(t, payload, string(row.Payload))
		require.Equal(t, map[string]string{"x-tenant": "acme", "x-quote": `it's "q"`}, row.Headers)
		require.Equal(t, storedriver.StatusPending, row.Status)
		require.NotNil(t, row.MaxRetryTimes)
		require.Equal(t, 2, *row.MaxRetryTimes)
		require.Zero(t, row.RetryTimes)
		require.Zero(t, row.RedriveCount)
		require.Nil(t, row.NextRetryAt)
		require.Nil(t, row.LastError)
		require.Nil(t, row.SentAt)
		require.Nil(t, row.OrderingKey)
		require.Nil(t, row.OrderingSeq)
		require.WithinDuration(t, time.Now(), row.CreatedAt, time.Minute)

		other := e.get(res[1].MessageID)
		require.JSONEq(t, `"a string"`, string(other.Payload))
		require.Empty(t, other.Headers)
		require.Nil(t, other.MaxRetryTimes)

		// GetAll leaves out IDs without a row.
		all, err := e.d().GetAll(e.ctx, []uuid.UUID{res[0].MessageID, res[1].MessageID, uuid.New()})
		require.NoError(t, err)
		require.Len(t, all, 2)
		require.Equal(t, "order.paid", all[res[1].MessageID].Topic)

		_, err = e.d().Get(e.ctx, uuid.New())
		require.ErrorIs(t, err, storedriver.ErrNotFound)
	})

	t.Run("RolledBackWritesNothing", func(t *testing.T) {
		e := newEnv(t, h)
		var ids []uuid.UUID
		err := e.InTx(e.ctx, func(enqueue Enqueue) error {
			for _, m := range []storedriver.Message{msg("order.created", `{}`), keyed("order.created", "order-1", 1)} {
				res, err := enqueue(e.ctx, m)
				if err != nil {
					return err
				}
				ids = append(ids, res.MessageID)
			}
			return errors.New("the business transaction fails")
		})
		require.Error(t, err)
		require.Len(t, ids, 2)
		for _, id := range ids {
			e.requireNotFound(id)
		}
		require.Zero(t, e.total())
		res := e.claim(10, storedriver.OrderingRules{})
		require.Empty(t, res.Claimed)
	})

	t.Run("InvalidMessagesAreRefusedAndWriteNothing", func(t *testing.T) {
		e := newEnv(t, h)
		max := e.d().MaxPayloadBytes()
		require.Positive(t, max)
		big := `"` + strings.Repeat("x", max) + `"`
		tooMany := storedriver.MaxRetryTimesLimit + 1
		for _, tc := range []struct {
			name  string
			msg   storedriver.Message
			field string
		}{
			{"EmptyTopic", msg("", `{}`), "topic"},
			{"TopicWithSpace", msg("order created", `{}`), "topic"},
			{"TopicTooLong", msg(strings.Repeat("a", 201), `{}`), "topic"},
			{"EmptyPayload", msg("a", ``), "payload"},
			{"InvalidJSON", msg("a", `{"a":`), "payload"},
			{"PayloadTooLarge", msg("a", big), "payload"},
			{"EmptyHeaderKey", storedriver.Message{Topic: "a", Payload: json.RawMessage(`{}`), Headers: map[string]string{"": "x"}}, "headers"},
			{"BlankOrderingKey", storedriver.Message{Topic: "a", Payload: json.RawMessage(`{}`), OrderingKey: "  "}, "ordering_key"},
			{"TooManyRetries", storedriver.Message{Topic: "a", Payload: json.RawMessage(`{}`), MaxRetryTimes: &tooMany}, "max_retry_times"},
			{"DeliverAfterTooFar", storedriver.Message{Topic: "a", Payload: json.RawMessage(`{}`), DeliverAfter: time.Now().AddDate(2, 0, 0)}, "deliver_after"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				require.Equal(t, tc.field, validationField(t, e.d().Validate(tc.msg)), "Validate")
				// Refused inside a transaction that then commits: nothing is written, and
				// the transaction is not broken.
				var okID uuid.UUID
				err := e.InTx(e.ctx, func(enqueue Enqueue) error {
					_, err := enqueue(e.ctx, tc.msg)
					require.Equal(t, tc.field, validationField(t, err), "Enqueue")
					res, err := enqueue(e.ctx, msg("after.refusal", `{}`))
					okID = res.MessageID
					return err
				})
				require.NoError(t, err)
				require.Equal(t, "after.refusal", e.get(okID).Topic)
			})
		}
		require.NoError(t, e.d().Validate(msg("order.created", `{"ok": true}`)))
		st, err := e.d().Stats(e.ctx)
		require.NoError(t, err)
		require.Equal(t, map[string]map[storedriver.Status]int64{"after.refusal": {storedriver.StatusPending: 10}}, st.ByTopic,
			"only the valid messages were written")
	})
}

// testIdempotencyKey pins Message.IdempotencyKey (a second enqueue with a key a row holds
// writes nothing, reports Duplicate with the holder's ID, and leaves the caller's
// transaction usable) and an explicit Message.MessageID given twice (the second enqueue
// fails, as the message_id unique key refuses it, and the first row stays as it was).
func testIdempotencyKey(t *testing.T, h Harness) {
	e := newEnv(t, h)
	withKey := func(key string, n int) storedriver.Message {
		return storedriver.Message{Topic: "order.created", Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, n)), IdempotencyKey: key}
	}
	first := e.enqueue(withKey("order-42-created", 1))[0]
	require.False(t, first.Duplicate)

	var again, other, inTx, inTxAgain storedriver.Enqueued
	err := e.InTx(e.ctx, func(enqueue Enqueue) error {
		var err error
		if again, err = enqueue(e.ctx, withKey("order-42-created", 2)); err != nil {
			return err
		}
		// The transaction goes on and writes other rows, a repeated key among them.
		if other, err = enqueue(e.ctx, withKey("order-43-created", 3)); err != nil {
			return err
		}
		if inTx, err = enqueue(e.ctx, withKey("order-44-created", 4)); err != nil {
			return err
		}
		inTxAgain, err = enqueue(e.ctx, withKey("order-44-created", 5))
		return err
	})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.MessageID, again.MessageID, "the message that holds the key")
	require.False(t, other.Duplicate)
	require.False(t, inTx.Duplicate)
	require.True(t, inTxAgain.Duplicate, "a key the transaction itself wrote")
	require.Equal(t, inTx.MessageID, inTxAgain.MessageID)
	require.JSONEq(t, `{"n": 1}`, string(e.get(first.MessageID).Payload), "the holder is unchanged")
	require.Equal(t, storedriver.StatusPending, e.get(other.MessageID).Status)
	require.JSONEq(t, `{"n": 4}`, string(e.get(inTx.MessageID).Payload))
	require.EqualValues(t, 3, e.total())

	// Messages without a key are never duplicates of each other.
	for _, r := range e.enqueue(msg("plain", `{}`), msg("plain", `{}`)) {
		require.False(t, r.Duplicate)
	}

	// An explicit message ID is the message's identity: given again, the enqueue fails and
	// its transaction rolls back; the first row stays.
	id := uuid.Must(uuid.NewV7())
	byID := storedriver.Message{Topic: "order.shipped", Payload: json.RawMessage(`{"first": true}`), MessageID: id}
	require.Equal(t, id, e.enqueue(byID)[0].MessageID)
	var sibling uuid.UUID
	err = e.InTx(e.ctx, func(enqueue Enqueue) error {
		res, err := enqueue(e.ctx, msg("order.sibling", `{}`))
		if err != nil {
			return err
		}
		sibling = res.MessageID
		second := byID
		second.Payload = json.RawMessage(`{"first": false}`)
		res, err = enqueue(e.ctx, second)
		if err == nil {
			require.False(t, res.Duplicate)
			return errors.New("storetest: a second enqueue with the same message ID succeeded")
		}
		require.NotErrorIs(t, err, storedriver.ErrNotFound)
		var verr *storedriver.ValidationError
		require.False(t, errors.As(err, &verr), "not a validation error: %v", err)
		return err
	})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "storetest:", "the second enqueue with the same message ID must fail")
	row := e.get(id)
	require.Equal(t, "order.shipped", row.Topic)
	require.JSONEq(t, `{"first": true}`, string(row.Payload))
	e.requireNotFound(sibling)
	require.EqualValues(t, 6, e.total())
}
