package app

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ConfigError is returned by [Open] and [Connect] when the configuration is wrong: a value
// the config does not allow, an unparsable database_url, or a Temporal namespace that does
// not exist. Fixing the config (or the namespace) is what helps; retrying does not.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// UnavailableError is returned by [Open] and [Connect] when the database or Temporal does
// not answer: the config may be right and the service down, so a later retry may succeed.
type UnavailableError struct {
	Service string // "PostgreSQL", "MySQL" or "Temporal"
	Err     error
}

func (e *UnavailableError) Error() string { return e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// IsConfigError reports whether err, or an error it wraps, is a [ConfigError].
func IsConfigError(err error) bool {
	var c *ConfigError
	return errors.As(err, &c)
}

// IsUnavailable reports whether err, or an error it wraps, is an [UnavailableError].
func IsUnavailable(err error) bool {
	var u *UnavailableError
	return errors.As(err, &u)
}

// rejectedLogin reports whether PostgreSQL answered and refused the login: a wrong user,
// password or database name, which the config must fix.
func rejectedLogin(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	// Class 28: invalid authorization specification; 3D000: invalid catalog name (no such
	// database).
	return strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000"
}
