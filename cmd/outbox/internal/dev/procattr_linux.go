package dev

import "syscall"

// childAttr keeps a server child out of the terminal's process group (outbox dev stops it
// itself, after the worker) and ends it should outbox dev die without stopping it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
