package dev

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A dev folder one outbox dev runs on is neither wiped by another's --reset nor used by
// another; once the first stops, --reset wipes it.
func TestDevFolderIsHeldByOneSession(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".outbox-dev")
	release, err := prepareDir(dir, false)
	require.NoError(t, err)
	data := filepath.Join(dir, "postgres", "PG_VERSION")
	require.NoError(t, os.MkdirAll(filepath.Dir(data), 0o755))
	require.NoError(t, os.WriteFile(data, []byte("15\n"), 0o600))

	for _, reset := range []bool{true, false} {
		_, err := prepareDir(dir, reset)
		require.ErrorContains(t, err, "another outbox dev is using "+dir, "reset %v", reset)
	}
	require.FileExists(t, data, "the running session's data")

	release()
	release, err = prepareDir(dir, true)
	require.NoError(t, err)
	defer release()
	require.NoFileExists(t, data)
	require.FileExists(t, filepath.Join(dir, markerFile))
}
