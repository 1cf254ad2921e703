// Package proc starts pdlink daemons as child processes and finds where they
// serve, for pdctl demo and the end-to-end tests.
//
// A daemon is started with port 0 listeners where it can; its JSON log line
// "serving" names the bound addresses, so no port is guessed. The goroutine
// that scans a child's stderr is owned by Process and ends when the child's
// stderr closes.
package proc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// ErrNotServing means the child exited or timed out before it logged "serving".
var ErrNotServing = errors.New("daemon did not start serving")

// Process is one running daemon.
type Process struct {
	Name     string
	Cmd      *exec.Cmd
	Bin      string
	Args     []string
	GRPCAddr string // as logged: a unix socket path or host:port
	HTTPAddr string // host:port

	mu      sync.Mutex
	logs    []string
	scanned chan struct{}
	exited  chan struct{}
	waitErr error
}

// Start runs bin with args and waits until it logs "serving" or timeout.
func Start(ctx context.Context, bin string, args []string, timeout time.Duration) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Name: filepath.Base(bin), Cmd: cmd, Bin: bin, Args: args, scanned: make(chan struct{}), exited: make(chan struct{})}
	serving := make(chan struct{})
	go func() {
		defer close(p.scanned)
		var once sync.Once
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs = append(p.logs, line)
			p.mu.Unlock()
			var entry struct {
				Msg  string `json:"msg"`
				GRPC string `json:"grpc"`
				HTTP string `json:"http"`
			}
			if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "serving" {
				p.mu.Lock()
				p.GRPCAddr, p.HTTPAddr = entry.GRPC, entry.HTTP
				p.mu.Unlock()
				once.Do(func() { close(serving) })
			}
		}
	}()
	go func() {
		<-p.scanned
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-serving:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("%s: %w (exited: %v)\n%s", p.Name, ErrNotServing, p.waitErr, p.Logs())
	case <-t.C:
	case <-ctx.Done():
	}
	_ = p.Kill()
	return nil, fmt.Errorf("%s: %w within %v\n%s", p.Name, ErrNotServing, timeout, p.Logs())
}

// LogField returns field of the first JSON log line with message msg, or "".
func (p *Process) LogField(msg, field string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.logs {
		var entry map[string]any
		if json.Unmarshal([]byte(l), &entry) == nil && entry["msg"] == msg {
			if v, ok := entry[field].(string); ok {
				return v
			}
		}
	}
	return ""
}

// Logs returns everything the child wrote to stderr so far.
func (p *Process) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := ""
	for _, l := range p.logs {
		out += l + "\n"
	}
	return out
}

// Stop sends SIGTERM and waits up to timeout for a clean exit; it returns
// the exit error (nil for exit 0), killing the child if it overstays.
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.waitErr
	case <-time.After(timeout):
		_ = p.Kill()
		return fmt.Errorf("%s: no exit within %v of SIGTERM", p.Name, timeout)
	}
}

// Kill sends SIGKILL and waits for the child to be reaped.
func (p *Process) Kill() error {
	_ = p.Cmd.Process.Signal(os.Kill)
	<-p.exited
	return nil
}

// Restart starts the same binary again with args (nil: the arguments of
// this run), once this child has exited; a child still running is killed
// first. Pin every port 0 listener to the address it bound to keep the
// daemon's addresses across the restart.
func (p *Process) Restart(ctx context.Context, args []string, timeout time.Duration) (*Process, error) {
	select {
	case <-p.exited:
	default:
		_ = p.Kill()
	}
	if args == nil {
		args = p.Args
	}
	return Start(ctx, p.Bin, args, timeout)
}

// Exited is closed once the child has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }
