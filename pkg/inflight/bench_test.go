package inflight

import (
	"testing"
	"time"
)

// BenchmarkTouch measures the hot path of a transferring room: refresh its
// idle deadline.
func BenchmarkTouch(b *testing.B) {
	q := newTestQueue(b)
	es := make([]Entry[int], 1024)
	for i := range es {
		q.Push(&es[i], cA, 0)
	}
	b.ReportAllocs()
	now := int64(0)
	for i := 0; b.Loop(); i++ {
		now++
		q.Touch(&es[i&1023], now)
	}
}

// BenchmarkMoveAndExpire measures a state change plus the per-step expiry
// check.
func BenchmarkMoveAndExpire(b *testing.B) {
	q := newTestQueue(b)
	es := make([]Entry[int], 1024)
	for i := range es {
		q.Push(&es[i], cA, 0)
	}
	b.ReportAllocs()
	now := int64(0)
	for i := 0; b.Loop(); i++ {
		now++
		q.Move(&es[i&1023], Class(i%3), now)
		if e := q.NextExpired(now); e != nil {
			q.Remove(e)
			q.Push(e, cA, now)
		}
	}
	_ = time.Second
}
