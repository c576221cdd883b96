package cli

import (
	"errors"
	"fmt"

	"github.com/outbox-go/outbox/app"
)

// Exit codes of the outbox command. They are stable: scripts may rely on them. The values
// are those of BSD's sysexits.h, which shells and supervisors already know.
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitFailure: the command ran and failed (a message that does not exist, a refused
	// redrive, a worker that stopped on an error).
	ExitFailure = 1
	// ExitUsage: the command line is wrong (an unknown command or flag, a missing or extra
	// argument, a flag value outside what it allows). Nothing was done.
	ExitUsage = 64
	// ExitUnavailable: PostgreSQL or Temporal did not answer. The config may be right; a
	// retry once the service is up may succeed.
	ExitUnavailable = 69
	// ExitConfig: the configuration is wrong (an unreadable or invalid config file, a value
	// it does not allow, a login PostgreSQL refuses, a Temporal namespace that does not
	// exist). Retrying does not help; fixing the config does.
	ExitConfig = 78
)

// ExitCode returns the exit code the outbox command ends with after err.
func ExitCode(err error) int {
	var u *usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &u):
		return ExitUsage
	case app.IsConfigError(err):
		return ExitConfig
	case app.IsUnavailable(err):
		return ExitUnavailable
	default:
		return ExitFailure
	}
}

// usageError is a command line the command does not accept.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// UsageErrorf is usageErrorf for the commands defined outside this package (outbox dev,
// outbox bench): the command exits with ExitUsage.
func UsageErrorf(format string, args ...any) error { return usageErrorf(format, args...) }

// usageErrorf returns a usage error: the command line asks for something the command does
// not allow.
func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}
