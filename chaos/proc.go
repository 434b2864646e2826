package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// procState is what the harness last did to a process.
type procState int

const (
	procDown    procState = iota // not started, exited or killed
	procRunning                  // started and not stopped
	procStopped                  // SIGSTOP'd, waiting for SIGCONT
)

// proc is one service run as its own OS process from a real binary. Its
// output goes to <dir>/<name>.log (appended across restarts). The process
// is in a process group of its own (a Ctrl-C of the harness does not reach
// it; the harness stops it) and dies with the harness (Pdeathsig).
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	dir  string
	cred *syscall.Credential // run as this user (Postgres refuses root); nil = the harness's

	// supervise: a process that exits without the harness having killed
	// or stopped it is started again after a second, as an orchestrator
	// would; exits counts those.
	supervise bool

	mu       sync.Mutex
	cmd      *exec.Cmd
	state    procState
	done     chan struct{} // closed when the current process has exited
	starts   int
	expected bool // the harness killed or is stopping the current process
	exits    int  // exits nobody asked for
	closed   bool // teardown: never start again
}

// ErrNotRunning: a fault was asked of a process that is not running.
var ErrNotRunning = errors.New("chaos: process not running")

// start launches the process; it is an error to start a running one.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != procDown {
		return fmt.Errorf("chaos: %s already started", p.name)
	}
	logf, err := os.OpenFile(filepath.Join(p.dir, p.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "--- chaos: start %d at %s\n", p.starts+1, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: p.cred}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("chaos: start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		p.mu.Lock()
		restart := false
		if p.cmd == cmd {
			p.state = procDown
			if !p.expected && !p.closed {
				p.exits++
				restart = p.supervise
			}
		}
		p.mu.Unlock()
		close(done)
		if restart {
			time.AfterFunc(time.Second, func() {
				p.mu.Lock()
				again := p.state == procDown && !p.closed && p.cmd == cmd
				p.mu.Unlock()
				if again {
					_ = p.start()
				}
			})
		}
	}()
	p.cmd, p.state, p.done, p.expected = cmd, procRunning, done, false
	p.starts++
	return nil
}

// signal sends sig to the running (or stopped) process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == procDown || p.cmd == nil {
		return ErrNotRunning
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("chaos: %s: signal %v: %w", p.name, sig, err)
	}
	switch sig {
	case syscall.SIGSTOP:
		p.state = procStopped
	case syscall.SIGCONT:
		p.state = procRunning
	}
	return nil
}

// kill9 kills the process and its process group (Postgres's backends
// with its postmaster) with SIGKILL and waits until it has exited.
func (p *proc) kill9() error {
	p.mu.Lock()
	done := p.done
	p.expected = true
	var pid int
	if p.state != procDown && p.cmd != nil {
		pid = p.cmd.Process.Pid
	}
	p.mu.Unlock()
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	if pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL) // the group: children too
	}
	<-done
	return nil
}

// stop ends the process gracefully (SIGCONT, then SIGTERM; SIGKILL after
// grace) and waits for it.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	done, running := p.done, p.state != procDown
	p.expected, p.closed = true, true
	p.mu.Unlock()
	if !running {
		return
	}
	_ = p.signal(syscall.SIGCONT)
	_ = p.signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = p.kill9()
	}
}

// unexpectedExits returns how many times the process exited by itself.
func (p *proc) unexpectedExits() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exits
}

// current returns the process's state.
func (p *proc) current() procState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// pid returns the running process's id, 0 when down.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == procDown || p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitTCP waits until addr accepts connections, ctx ends or timeout passes.
func waitTCP(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %s not accepting connections after %s: %w", addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
