package mariadbserver

import "syscall"

// childAttr runs the server in its own process group (Ctrl-C reaches outbox dev, which
// stops the server in order) and has the kernel ask it to shut down (SIGTERM) if outbox
// dev dies first.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
