// Package inflight is the inflight queue used on both sides of pdlink: it
// holds every item (room, tombstone) in a class with a deadline and answers
// "how many, how old, which one expired, which are overdue" in O(1).
//
// # Design
//
// Every item of a class has the same deadline duration, and items enter a
// class in time order, so each class is an intrusive doubly linked FIFO
// ordered by entry time:
//
//   - Push, Remove, Move (change class) and Touch (refresh an idle deadline:
//     the entry goes to the tail with a new entry time) are O(1) and do not
//     allocate; the caller owns the Entry (usually embedded in its item).
//   - The oldest item of a class is its head, so OldestAge is O(1) and
//     NextExpired looks at one head per class (O(classes)).
//   - "Overdue" (older than OverdueFraction of the deadline) is a boundary
//     pointer per class that only moves towards the tail; AdvanceOverdue
//     moves it past the entries that became overdue, amortised O(1) each.
//     Remove and Touch keep the count exact.
//
// Time is int64 monotonic nanoseconds supplied by the caller (for example
// int64(time.Since(start)) from one process-wide start). The queue never
// reads the clock; if a caller passes an earlier time than one it has
// already seen, the queue clamps it to the latest time so the FIFOs stay
// ordered. There is no "no deadline" class (pdlink R9).
//
// The package imports nothing from pdlink and is generic over the item
// type: Entry[K].Value points back to the caller's item.
//
// # Ownership
//
// A Queue is not safe for concurrent use. Exactly one owner (the goroutine
// or mutex that owns the room table) calls every method; the package starts
// no goroutine and does no I/O.
//
// # Usage
//
//  1. Build the queue once with New(Config{Deadlines: per-class durations,
//     OverdueFraction: f}).
//  2. For each item, Push its Entry into the class it starts in; Move it
//     when the item changes class; Touch it when the item makes progress
//     that should refresh its deadline; Remove it when the item is dropped.
//  3. On every tick (and as often as convenient), loop on NextExpired(now)
//     and Move or Remove each returned entry before asking again; call
//     AdvanceOverdue(now) before reading Overdue.
//  4. Read Len, Count, OldestAge and Overdue for metrics at any time.
package inflight
