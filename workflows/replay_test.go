package workflows_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/workflows"
)

// TestReplayRecordedHistories replays the OutboxDelivery and OutboxBatch histories recorded from real runs
// (testdata/<generation>/*.json) against the current workflow code. Each generation was
// recorded by the code of its day; all of them must still replay. A change to Delivery that would
// make an in-flight delivery fail with a nondeterminism error after a deploy fails here.
// Record new histories with:
//
//	OUTBOX_RECORD_HISTORIES=1 go test -count=1 -run TestRecordHistories ./e2e/
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*", "*.json"))
	require.NoError(t, err)
	generations, err := filepath.Glob(filepath.Join("testdata", "v*"))
	require.NoError(t, err)
	require.NotEmpty(t, generations)
	sort.Slice(generations, func(i, j int) bool { return generationOf(generations[i]) < generationOf(generations[j]) })
	latest := generations[len(generations)-1]

	// The paths the recorder writes; a missing one in the latest generation means a path
	// went unguarded.
	want := []string{
		"delivery_success.json",
		"delivery_retries_then_success.json",
		"delivery_dead_letter.json",
		"delivery_check_processed_skip.json",
		"delivery_last_ambiguous_checked.json",
		"delivery_unknown_topic_dead_letter.json",
		"delivery_check_first.json",
		"delivery_store_outage.json",
		"delivery_unrecorded.json",
		"delivery_team_activity_retried.json",
		"delivery_team_paused_last_attempt.json",
		"delivery_team_workflow_started.json",
		"delivery_team_workflow_signalled.json",
		"delivery_first_task_lost.json",
		"delivery_first_attempt_activity.json",
		"batch_sent.json",
		"batch_handed_over.json",
		"delivery_from_batch.json",
		"delivery_nexus_retried.json",
		"delivery_backoff_capped.json",
		"delivery_team_workflow_id_refused.json",
		"delivery_unanswered_check_kept.json",
		"delivery_dead_letter_found_sent.json",
	}
	for _, name := range want {
		require.FileExists(t, filepath.Join(latest, name))
	}

	logger := log.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, file := range files {
		name, _ := filepath.Rel("testdata", file)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			info, err := os.Stat(file)
			require.NoError(t, err)
			require.NotZero(t, info.Size())

			replayer := worker.NewWorkflowReplayer()
			replayer.RegisterWorkflowWithOptions(workflows.Delivery, workflows.RegisterOptions())
			replayer.RegisterWorkflowWithOptions(workflows.Batch, workflows.BatchRegisterOptions())
			require.NoError(t, replayer.ReplayWorkflowHistoryFromJSONFile(logger, file),
				"OutboxDelivery no longer replays %s: guard the change with workflow.GetVersion", file)
		})
	}
}

// generationOf returns the number of a generation folder such as testdata/v2.
func generationOf(dir string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), "v"))
	return n
}
