//go:build unix && !linux

package pgcluster

import "syscall"

// childAttr runs PostgreSQL in its own process group (Ctrl-C reaches outbox dev, which
// stops PostgreSQL in order), as cred when set. Without a parent-death signal here, a
// killed outbox dev leaves PostgreSQL running; the next start finds its lock file.
func childAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
