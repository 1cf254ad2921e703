package inflight

import (
	"errors"
	"fmt"
	"time"
)

// MaxClasses is the number of classes a Queue can hold.
const MaxClasses = 8

// Class is a small integer naming a group of entries that share one
// deadline duration (for pdlink: a room state).
type Class uint8

// Entry is the intrusive node a caller embeds (or allocates) once per item.
// Value points back to the caller's item. The zero Entry is not queued.
// An Entry belongs to at most one Queue at a time.
type Entry[K any] struct {
	Value K

	prev, next *Entry[K]
	enteredAt  int64
	class      Class
	queued     bool
	overdue    bool
}

// Queued reports whether e is in a queue.
func (e *Entry[K]) Queued() bool { return e.queued }

// Class returns the class e is queued in (meaningless if not queued).
func (e *Entry[K]) Class() Class { return e.class }

// EnteredAt returns the time (monotonic nanoseconds) e entered its class or
// was last touched; its deadline counts from there.
func (e *Entry[K]) EnteredAt() int64 { return e.enteredAt }

// Config holds the per-class deadlines.
type Config struct {
	// Deadlines[c] is how long an entry may stay in class c (since entering
	// or its last Touch). Every class has one: there is no "no deadline".
	Deadlines []time.Duration
	// OverdueFraction in (0, 1]: an entry is overdue once it has spent this
	// fraction of its class deadline.
	OverdueFraction float64
}

// Validate checks cfg and names the faulty field.
func (cfg Config) Validate() error {
	if len(cfg.Deadlines) == 0 || len(cfg.Deadlines) > MaxClasses {
		return fmt.Errorf("inflight: Deadlines: need 1..%d classes, got %d", MaxClasses, len(cfg.Deadlines))
	}
	for c, d := range cfg.Deadlines {
		if d <= 0 {
			return fmt.Errorf("inflight: Deadlines[%d]: must be > 0, got %v", c, d)
		}
	}
	if !(cfg.OverdueFraction > 0 && cfg.OverdueFraction <= 1) {
		return fmt.Errorf("inflight: OverdueFraction: must be in (0, 1], got %v", cfg.OverdueFraction)
	}
	return nil
}

// list is one class: a FIFO ordered by enteredAt (oldest at head).
type list[K any] struct {
	head, tail *Entry[K]
	n          int
	deadline   int64 // nanoseconds
	overdueAge int64 // nanoseconds: deadline * OverdueFraction
	// boundary is the oldest entry not yet marked overdue; every entry
	// before it is overdue. nil: all entries are overdue (or none exist).
	boundary *Entry[K]
	nOverdue int
}

// Queue is a set of per-class FIFOs with deadlines. Every operation is O(1)
// except NextExpired and AdvanceOverdue, which are O(classes) plus amortised
// O(1) per entry. It is not safe for concurrent use: one owner calls it.
type Queue[K any] struct {
	classes  [MaxClasses]list[K]
	nClasses int
	n        int
	last     int64 // latest time seen; time is clamped to never go back
}

// New returns an empty Queue for cfg.
func New[K any](cfg Config) (*Queue[K], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	q := &Queue[K]{nClasses: len(cfg.Deadlines)}
	for c, d := range cfg.Deadlines {
		l := &q.classes[c]
		l.deadline = int64(d)
		l.overdueAge = int64(float64(d) * cfg.OverdueFraction)
		if l.overdueAge <= 0 {
			l.overdueAge = 1
		}
	}
	return q, nil
}

// Classes returns the number of configured classes.
func (q *Queue[K]) Classes() int { return q.nClasses }

// clamp returns now, or the latest time already seen if now is earlier, so
// every class stays ordered by entry time.
func (q *Queue[K]) clamp(now int64) int64 {
	if now < q.last {
		return q.last
	}
	q.last = now
	return now
}

// Now returns the latest time the queue has seen.
func (q *Queue[K]) Now() int64 { return q.last }

// Push appends e to class c at time now. It panics if e is already queued or
// c is out of range: both are caller bugs that would corrupt the lists.
func (q *Queue[K]) Push(e *Entry[K], c Class, now int64) {
	if e.queued {
		panic("inflight: Push of a queued entry")
	}
	if int(c) >= q.nClasses {
		panic("inflight: Push to an unknown class")
	}
	now = q.clamp(now)
	l := &q.classes[c]
	e.class, e.enteredAt, e.queued, e.overdue = c, now, true, false
	e.prev, e.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = e
	} else {
		l.head = e
	}
	l.tail = e
	if l.boundary == nil {
		l.boundary = e
	}
	l.n++
	q.n++
}

// Remove takes e out of its class. Removing an unqueued entry is a no-op.
func (q *Queue[K]) Remove(e *Entry[K]) {
	if !e.queued {
		return
	}
	l := &q.classes[e.class]
	if l.boundary == e {
		l.boundary = e.next
	}
	if e.overdue {
		l.nOverdue--
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next, e.queued, e.overdue = nil, nil, false, false
	l.n--
	q.n--
}

// Move puts e (queued or not) at the tail of class c with a fresh deadline.
func (q *Queue[K]) Move(e *Entry[K], c Class, now int64) {
	q.Remove(e)
	q.Push(e, c, now)
}

// Touch refreshes e's deadline: it moves to the tail of its own class as if
// it had just entered (an idle deadline).
func (q *Queue[K]) Touch(e *Entry[K], now int64) {
	if !e.queued {
		return
	}
	q.Move(e, e.class, now)
}

// Deadline returns the time at which e expires.
func (q *Queue[K]) Deadline(e *Entry[K]) int64 {
	return e.enteredAt + q.classes[e.class].deadline
}

// DeadlineOf returns class c's deadline duration.
func (q *Queue[K]) DeadlineOf(c Class) time.Duration {
	return time.Duration(q.classes[c].deadline)
}

// NextExpired returns the entry with the earliest deadline that is <= now,
// or nil. It does not remove it: the caller must Remove or Move it before
// calling NextExpired again, or it gets the same entry back.
func (q *Queue[K]) NextExpired(now int64) *Entry[K] {
	now = q.clamp(now)
	var best *Entry[K]
	var bestAt int64
	for c := 0; c < q.nClasses; c++ {
		l := &q.classes[c]
		if l.head == nil {
			continue
		}
		at := l.head.enteredAt + l.deadline
		if at <= now && (best == nil || at < bestAt) {
			best, bestAt = l.head, at
		}
	}
	return best
}

// NextDeadline returns the earliest deadline of any queued entry, and false
// if the queue is empty. A driver can arm a single timer on it.
func (q *Queue[K]) NextDeadline() (int64, bool) {
	var at int64
	ok := false
	for c := 0; c < q.nClasses; c++ {
		l := &q.classes[c]
		if l.head == nil {
			continue
		}
		d := l.head.enteredAt + l.deadline
		if !ok || d < at {
			at, ok = d, true
		}
	}
	return at, ok
}

// AdvanceOverdue marks entries that have spent OverdueFraction of their
// deadline as overdue. Amortised O(1) per entry: each entry is passed once.
func (q *Queue[K]) AdvanceOverdue(now int64) {
	now = q.clamp(now)
	for c := 0; c < q.nClasses; c++ {
		l := &q.classes[c]
		for b := l.boundary; b != nil && b.enteredAt+l.overdueAge <= now; b = l.boundary {
			b.overdue = true
			l.nOverdue++
			l.boundary = b.next
		}
	}
}

// Len returns the number of queued entries.
func (q *Queue[K]) Len() int { return q.n }

// Count returns the number of entries in class c.
func (q *Queue[K]) Count(c Class) int { return q.classes[c].n }

// Oldest returns the entry of class c that entered (or was touched) first.
func (q *Queue[K]) Oldest(c Class) *Entry[K] { return q.classes[c].head }

// OldestAge returns how long the oldest entry of class c has been there (0
// if the class is empty). For a touched class this is the longest idle time.
func (q *Queue[K]) OldestAge(c Class, now int64) time.Duration {
	h := q.classes[c].head
	if h == nil {
		return 0
	}
	if now < q.last {
		now = q.last
	}
	return time.Duration(now - h.enteredAt)
}

// Overdue returns how many entries of class c were overdue at the last
// AdvanceOverdue.
func (q *Queue[K]) Overdue(c Class) int { return q.classes[c].nOverdue }

// Each calls fn for the entries of class c, oldest first, until fn returns
// false. fn must not modify the queue.
func (q *Queue[K]) Each(c Class, fn func(e *Entry[K]) bool) {
	for e := q.classes[c].head; e != nil; e = e.next {
		if !fn(e) {
			return
		}
	}
}

// Check verifies the queue's internal invariants (links, order, counts,
// overdue boundary). It is O(n) and meant for tests.
func (q *Queue[K]) Check() error {
	total := 0
	for c := 0; c < q.nClasses; c++ {
		l := &q.classes[c]
		n, nOver := 0, 0
		var prev *Entry[K]
		seenBoundary := false
		for e := l.head; e != nil; e = e.next {
			if !e.queued || e.class != Class(c) {
				return fmt.Errorf("class %d: entry not marked queued in this class", c)
			}
			if e.prev != prev {
				return fmt.Errorf("class %d: broken prev link", c)
			}
			if prev != nil && prev.enteredAt > e.enteredAt {
				return fmt.Errorf("class %d: not ordered by entry time", c)
			}
			if e == l.boundary {
				seenBoundary = true
			}
			if e.overdue {
				nOver++
				if seenBoundary {
					return fmt.Errorf("class %d: overdue entry at or after boundary", c)
				}
			} else if !seenBoundary {
				return fmt.Errorf("class %d: entry before boundary not overdue", c)
			}
			prev = e
			n++
		}
		if l.tail != prev {
			return fmt.Errorf("class %d: tail mismatch", c)
		}
		if !seenBoundary && l.boundary != nil {
			return fmt.Errorf("class %d: boundary not in list", c)
		}
		if n != l.n || nOver != l.nOverdue {
			return fmt.Errorf("class %d: count %d/%d overdue %d/%d", c, n, l.n, nOver, l.nOverdue)
		}
		total += n
	}
	if total != q.n {
		return errors.New("total count mismatch")
	}
	return nil
}
