package pgcluster

import "syscall"

// childAttr runs PostgreSQL in its own process group (Ctrl-C reaches outbox dev, which
// stops PostgreSQL in order), as cred when set, and has the kernel stop it if outbox dev
// dies first.
func childAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGQUIT, Credential: cred}
}
