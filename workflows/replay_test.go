package workflows_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/workflows"
)

// TestReplayRecordedHistories replays the OutboxDelivery histories recorded from real runs
// (testdata/*.json) against the current workflow code. A change to Delivery that would
// make an in-flight delivery fail with a nondeterminism error after a deploy fails here.
// Record new histories with:
//
//	OUTBOX_RECORD_HISTORIES=1 go test -count=1 -run TestRecordHistories ./e2e/
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	require.NoError(t, err)

	// The paths the recorder writes; a missing one means a path went unguarded.
	want := []string{
		"delivery_success.json",
		"delivery_retries_then_success.json",
		"delivery_dead_letter.json",
		"delivery_check_processed_skip.json",
	}
	for _, name := range want {
		require.FileExists(t, filepath.Join("testdata", name))
	}

	logger := log.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			info, err := os.Stat(file)
			require.NoError(t, err)
			require.NotZero(t, info.Size())

			replayer := worker.NewWorkflowReplayer()
			replayer.RegisterWorkflowWithOptions(workflows.Delivery, workflows.RegisterOptions())
			require.NoError(t, replayer.ReplayWorkflowHistoryFromJSONFile(logger, file),
				"OutboxDelivery no longer replays %s: guard the change with workflow.GetVersion", file)
		})
	}
}
