//go:build !linux

package dev

import "syscall"

// childAttr keeps a server child out of the terminal's process group: outbox dev stops it
// itself, after the worker.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
