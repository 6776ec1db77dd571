//go:build !linux

package redistest

import "syscall"

// SysProcAttr is for a process a test starts: its own process group, so that
// a test's SIGSTOP reaches only it.
func SysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
