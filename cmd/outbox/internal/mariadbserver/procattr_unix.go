//go:build unix && !linux

package mariadbserver

import "syscall"

// childAttr runs the server in its own process group (Ctrl-C reaches outbox dev, which
// stops the server in order). Without a parent-death signal here, a killed outbox dev
// leaves the server running; the next start finds it through its pid file.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
