package loglimit

import (
	"testing"
	"time"
)

type reason uint8

// One line per reason per interval: the others are counted, the next line let through
// says how many it stood for, and one reason never holds back another's.
func TestOneLinePerReasonPerInterval(t *testing.T) {
	now := time.Unix(1000, 0)
	l := New[reason](3, time.Second, func() time.Time { return now })
	if _, ok := l.Allow(0); !ok {
		t.Fatal("first line held back")
	}
	now = now.Add(500 * time.Millisecond)
	if _, ok := l.Allow(0); ok {
		t.Fatal("second line within the interval let through")
	}
	if _, ok := l.Allow(1); !ok {
		t.Fatal("another reason's line held back by this one's")
	}
	now = now.Add(500 * time.Millisecond)
	if n, ok := l.Allow(0); !ok || n != 1 {
		t.Fatalf("after the interval: let through %v, suppressed %d; want true, 1", ok, n)
	}
	if n, ok := l.Allow(7); !ok || n != 0 {
		t.Fatalf("reason out of range: %v, %d; want let through", ok, n)
	}
}
