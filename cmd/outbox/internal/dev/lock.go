package dev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes the dev folder's lock (its lock file, with flock) for this session, or
// says that another outbox dev holds it. The lock goes with the process, however it ends:
// a killed session leaves nothing to clean up.
func lockDir(dir string) (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, sessionLock), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another outbox dev is using %s: stop it first, or give this one a folder of its own with --dir", dir)
		}
		return nil, fmt.Errorf("--dir: lock %s: %w", dir, err)
	}
	return func() { _ = f.Close() }, nil
}
