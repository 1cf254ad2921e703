package daemon

import (
	"net"
	"os"
	"strconv"
	"time"
)

// Notifier speaks the systemd notification protocol (sd_notify) when the
// service manager gave the process a NOTIFY_SOCKET; otherwise it does nothing.
type Notifier struct {
	socket string
}

// NewNotifier reads NOTIFY_SOCKET from the environment.
func NewNotifier() *Notifier {
	return &Notifier{socket: os.Getenv("NOTIFY_SOCKET")}
}

// Enabled reports whether a service manager listens.
func (n *Notifier) Enabled() bool { return n.socket != "" }

// Notify sends one state string such as "READY=1". Errors are returned for
// the caller to log; a missing socket is not an error.
func (n *Notifier) Notify(state string) error {
	if n.socket == "" {
		return nil
	}
	addr := &net.UnixAddr{Name: n.socket, Net: "unixgram"}
	if addr.Name[0] == '@' {
		addr.Name = "\x00" + addr.Name[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, err = conn.Write([]byte(state))
	return err
}

// WatchdogInterval returns how often to send WATCHDOG=1 (half of what the
// unit asked for), or 0 when the unit asked for no watchdog or asked it of
// another process.
func WatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}
