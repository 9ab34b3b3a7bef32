//go:build unix

package config

import (
	"os/exec"
	"syscall"
)

// ownGroup runs cmd in a process group of its own and makes a timeout kill
// the whole group: a token CLI started by the shell would otherwise outlive
// it.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}
