package mysqlstore

import "fmt"

// DeadlockRetried returns how many transactions the store ran again after a deadlock.
func DeadlockRetried() int64 { return deadlockRetried.Load() }

// UnparkHeadsSQL is the sweep's statement that finds each key's first parked row.
func (s *Store) UnparkHeadsSQL() string { return fmt.Sprintf(unparkHeadsSQL, s.messages) }
