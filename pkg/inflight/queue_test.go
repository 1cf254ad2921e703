package inflight

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

const (
	cA Class = iota
	cB
	cC
)

func newTestQueue(t interface{ Fatal(...any) }) *Queue[int] {
	q, err := New[int](Config{
		Deadlines:       []time.Duration{10 * time.Second, 20 * time.Second, 5 * time.Second},
		OverdueFraction: 0.5,
	})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func sec(s int) int64 { return int64(time.Duration(s) * time.Second) }

func TestConfigValidateNamesTheField(t *testing.T) {
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{OverdueFraction: 0.5}, "inflight: Deadlines: need 1..8 classes, got 0"},
		{Config{Deadlines: []time.Duration{time.Second, 0}, OverdueFraction: 0.5}, "inflight: Deadlines[1]: must be > 0, got 0s"},
		{Config{Deadlines: []time.Duration{time.Second}, OverdueFraction: 0}, "inflight: OverdueFraction: must be in (0, 1], got 0"},
		{Config{Deadlines: []time.Duration{time.Second}, OverdueFraction: 1.5}, "inflight: OverdueFraction: must be in (0, 1], got 1.5"},
	}
	for _, tc := range cases {
		err := tc.cfg.Validate()
		if err == nil || err.Error() != tc.want {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestExpiryPopsOldestFirstAcrossClasses(t *testing.T) {
	q := newTestQueue(t)
	a, b, c := &Entry[int]{Value: 1}, &Entry[int]{Value: 2}, &Entry[int]{Value: 3}
	q.Push(a, cA, sec(0)) // expires at 10s
	q.Push(b, cB, sec(1)) // expires at 21s
	q.Push(c, cC, sec(2)) // expires at 7s

	if e := q.NextExpired(sec(6)); e != nil {
		t.Fatalf("nothing expires before 7s, got %v", e.Value)
	}
	var got []int
	for e := q.NextExpired(sec(30)); e != nil; e = q.NextExpired(sec(30)) {
		got = append(got, e.Value)
		q.Remove(e)
	}
	if want := []int{3, 1, 2}; !equalInts(got, want) {
		t.Fatalf("expiry order %v, want %v", got, want)
	}
	if q.Len() != 0 {
		t.Fatalf("Len = %d after draining", q.Len())
	}
}

func TestTouchRefreshesIdleDeadline(t *testing.T) {
	q := newTestQueue(t)
	a, b := &Entry[int]{Value: 1}, &Entry[int]{Value: 2}
	q.Push(a, cC, sec(0))
	q.Push(b, cC, sec(1))
	q.Touch(a, sec(4)) // a now expires at 9s, b at 6s
	if got := q.Oldest(cC); got != b {
		t.Fatalf("oldest after touch = %v, want b", got.Value)
	}
	if age := q.OldestAge(cC, sec(5)); age != 4*time.Second {
		t.Fatalf("oldest age = %v, want 4s", age)
	}
	if e := q.NextExpired(sec(6)); e != b {
		t.Fatalf("at 6s expected b to expire")
	}
	q.Remove(b)
	if e := q.NextExpired(sec(8)); e != nil {
		t.Fatalf("a was touched at 4s, must not expire at 8s")
	}
	if got := q.Deadline(a); got != sec(9) {
		t.Fatalf("deadline = %d, want 9s", got)
	}
}

func TestOverdueCountsAndBoundary(t *testing.T) {
	q := newTestQueue(t) // class A: 10s deadline, overdue after 5s
	es := make([]*Entry[int], 4)
	for i := range es {
		es[i] = &Entry[int]{Value: i}
		q.Push(es[i], cA, sec(i))
	}
	q.AdvanceOverdue(sec(6)) // entries at 0s and 1s are >= 5s old
	if n := q.Overdue(cA); n != 2 {
		t.Fatalf("overdue = %d, want 2", n)
	}
	q.Remove(es[0])
	q.Remove(es[2]) // the boundary entry
	q.Touch(es[1], sec(6))
	if n := q.Overdue(cA); n != 0 {
		t.Fatalf("overdue after remove/touch = %d, want 0", n)
	}
	q.AdvanceOverdue(sec(20))
	if n := q.Overdue(cA); n != 2 {
		t.Fatalf("overdue at 20s = %d, want 2", n)
	}
	if err := q.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestTimeGoingBackwardsIsClamped(t *testing.T) {
	q := newTestQueue(t)
	a, b := &Entry[int]{}, &Entry[int]{}
	q.Push(a, cA, sec(10))
	q.Push(b, cA, sec(3)) // clock hiccup: clamped to 10s
	if b.EnteredAt() != sec(10) {
		t.Fatalf("entered at %d, want clamped 10s", b.EnteredAt())
	}
	if err := q.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestPushQueuedEntryPanics(t *testing.T) {
	q := newTestQueue(t)
	a := &Entry[int]{}
	q.Push(a, cA, 0)
	defer func() {
		if recover() == nil {
			t.Fatal("expected panic")
		}
	}()
	q.Push(a, cB, 0)
}

// TestQueueMatchesModel drives random operations and compares every answer
// with a naive model (a slice scanned on every query).
func TestQueueMatchesModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		q := newTestQueue(rt)
		const n = 12
		entries := make([]*Entry[int], n)
		for i := range entries {
			entries[i] = &Entry[int]{Value: i}
		}
		type mstate struct {
			in      bool
			class   Class
			entered int64
		}
		model := make([]mstate, n)
		deadline := func(c Class) int64 { return int64(q.DeadlineOf(c)) }
		var now int64
		rt.Repeat(map[string]func(*rapid.T){
			"push": func(rt *rapid.T) {
				i := rapid.IntRange(0, n-1).Draw(rt, "i")
				c := Class(rapid.IntRange(0, 2).Draw(rt, "c"))
				if model[i].in {
					q.Move(entries[i], c, now)
				} else {
					q.Push(entries[i], c, now)
				}
				model[i] = mstate{true, c, now}
			},
			"remove": func(rt *rapid.T) {
				i := rapid.IntRange(0, n-1).Draw(rt, "i")
				q.Remove(entries[i])
				model[i].in = false
			},
			"touch": func(rt *rapid.T) {
				i := rapid.IntRange(0, n-1).Draw(rt, "i")
				q.Touch(entries[i], now)
				if model[i].in {
					model[i].entered = now
				}
			},
			"advance": func(rt *rapid.T) {
				now += int64(rapid.IntRange(0, 12).Draw(rt, "s")) * int64(time.Second)
				q.AdvanceOverdue(now)
				for e := q.NextExpired(now); e != nil; e = q.NextExpired(now) {
					m := model[e.Value]
					if !m.in || m.entered+deadline(m.class) > now {
						rt.Fatalf("entry %d expired early", e.Value)
					}
					q.Remove(e)
					model[e.Value].in = false
				}
			},
			"": func(rt *rapid.T) {
				if err := q.Check(); err != nil {
					rt.Fatal(err)
				}
				for c := Class(0); c < 3; c++ {
					cnt, over := 0, 0
					var oldest int64 = -1
					for _, m := range model {
						if !m.in || m.class != c {
							continue
						}
						cnt++
						if m.entered+deadline(c)/2 <= q.Now() {
							over++
						}
						if oldest < 0 || m.entered < oldest {
							oldest = m.entered
						}
						if m.entered+deadline(c) <= now {
							rt.Fatalf("entry older than its deadline after advance")
						}
					}
					if q.Count(c) != cnt {
						rt.Fatalf("class %d count %d, model %d", c, q.Count(c), cnt)
					}
					q.AdvanceOverdue(now)
					if q.Overdue(c) != over {
						rt.Fatalf("class %d overdue %d, model %d", c, q.Overdue(c), over)
					}
					if cnt > 0 && q.OldestAge(c, now) != time.Duration(now-oldest) {
						rt.Fatalf("class %d oldest age %v, model %v", c, q.OldestAge(c, now), time.Duration(now-oldest))
					}
				}
			},
		})
	})
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
