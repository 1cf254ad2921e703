// Package metrics exports pdlink's Prometheus metrics (DESIGN.md section
// 7). Names are pdlink_<what>_<unit>; every series carries side=prefill or
// side=decode as a constant label; no label is per room (per-room detail is
// /debug/rooms and AdminService).
//
// # Design
//
// Values that already live somewhere (room counts, oldest ages, overdue
// rooms, transition and failure totals in the room table; frame counters in
// the control plane; bytes in the data plane) are read at scrape time by
// one custom collector through the funcs in Sources, as Prometheus does
// with GaugeFunc: no goroutine polls, and a scrape costs one Stats call.
// Only durations, which exist nowhere else, are observed as they happen
// into histograms (Recorder).
//
// Every label value of a closed set (states, failure reasons, reject
// reasons, region refusal rules) is exported from the start at zero, so rate() and absent()
// behave in alerts before the first failure.
//
// # Goroutines
//
// None of its own. Collect runs on the scrape goroutine and calls the
// Sources funcs, which must be safe for concurrent use (they take the room
// owner's lock briefly). Recorder methods are safe from any goroutine.
package metrics
