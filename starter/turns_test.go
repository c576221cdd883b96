package starter

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store"
)

// TestByTopicTurns: a pass's rows start with their topics taking turns, each topic's rows
// in their order, so a row of another topic is not behind a pass's share of a backlog.
func TestByTopicTurns(t *testing.T) {
	t.Parallel()
	row := func(id int64, topic string) store.Claimed { return store.Claimed{ID: id, Topic: topic} }
	ids := func(rows []store.Claimed) []int64 {
		out := make([]int64, len(rows))
		for i, r := range rows {
			out[i] = r.ID
		}
		return out
	}
	in := []store.Claimed{row(1, "bulk"), row(2, "bulk"), row(3, "bulk"), row(4, "orders"), row(5, "bulk"), row(6, "audit"), row(7, "orders")}
	require.Equal(t, []int64{1, 4, 6, 2, 7, 3, 5}, ids(byTopicTurns(in)))
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7}, ids(in), "the claim's order is left alone")
	one := in[:3]
	require.Equal(t, []int64{1, 2, 3}, ids(byTopicTurns(one)), "one topic: as claimed")
}
