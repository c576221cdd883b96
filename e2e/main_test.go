package e2e

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/outbox-go/outbox/internal/testutil"
)

// binDir holds the outbox binary the tests build; it is removed when they end.
var binDir string

// buildOutbox builds the outbox binary once per test run.
var buildOutbox = sync.OnceValues(func() (string, error) { return testutil.BuildOutbox(binDir) })

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outbox-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
