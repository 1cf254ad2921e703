package auth

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// tok returns a distinct valid token.
func tok(c byte) []byte { return bytes.Repeat([]byte{c}, MinTokenLen) }

var (
	tokOld = tok('o')
	tokNew = tok('n')
	tokAlt = tok('x')
)

// writeTokenFile writes content to dir/name with mode and returns its path.
func writeTokenFile(t testing.TB, dir, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, "token")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// mustNew returns a Keyring over tokens on clk.
func mustNew(t interface {
	Helper()
	Fatal(...any)
}, clk *fakeClock, overlap, promote time.Duration, tokens ...[]byte) *Keyring {
	t.Helper()
	k, err := New(Config{Now: clk.Now, Overlap: overlap, PromoteDelay: promote}, tokens...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
