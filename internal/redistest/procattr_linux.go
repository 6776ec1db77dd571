package redistest

import "syscall"

// SysProcAttr is for a process a test starts: its own process group, so that
// a test's SIGSTOP reaches only it, and killed when the test binary dies (a
// -timeout panic or a kill would otherwise leave it running).
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
