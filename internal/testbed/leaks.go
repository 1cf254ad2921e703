package testbed

import (
	"fmt"
	"time"
)

// Baseline is each daemon's go_goroutines, by name, taken after a warm-up
// so it counts the sessions, connections and streams that stay.
func Baseline(ds []*Daemon) map[string]float64 {
	base := map[string]float64{}
	for _, d := range ds {
		base[d.Name] = d.Metric("go_goroutines", nil)
	}
	return base
}

// Leaks waits (bounded) for what a scenario must leave behind once its
// schedulers cleared: no room held (TablesEmpty, within the clear linger
// and slack) and every daemon's goroutines back near baseline
// (GoroutinesBack). It returns what it found otherwise.
func Leaks(ds []*Daemon, tm Timings, baseline map[string]float64, debugRooms bool) []string {
	leaks := TablesEmpty(ds, tm.Linger+5*time.Second, debugRooms)
	return append(leaks, GoroutinesBack(ds, baseline, 15*time.Second)...)
}

// TablesEmpty waits (bounded) for every daemon to hold no room: every
// pdlink_rooms{state} and pdlink_inflight_rooms at 0 and, with
// debugRooms, /debug/rooms empty too. It returns what it found otherwise.
func TablesEmpty(ds []*Daemon, bound time.Duration, debugRooms bool) []string {
	var leaks []string
	for _, d := range ds {
		var last string
		if _, ok := Eventually(bound, func() bool {
			mfs, err := d.Scrape()
			if err != nil {
				last = err.Error()
				return false
			}
			held, inflight := Sum(mfs, "pdlink_rooms", nil), Sum(mfs, "pdlink_inflight_rooms", nil)
			if !debugRooms {
				if held != 0 || inflight != 0 {
					last = fmt.Sprintf("%s holds %v rooms (%v inflight)", d.Name, held, inflight)
					return false
				}
				return true
			}
			rooms, err := d.Rooms()
			if err != nil {
				last = err.Error()
				return false
			}
			if held != 0 || inflight != 0 || len(rooms) != 0 {
				ex := ""
				if len(rooms) > 0 {
					ex = fmt.Sprintf(" e.g. room %d %s/%s %s", rooms[0].Room, rooms[0].State, rooms[0].Visible, rooms[0].Reason)
				}
				last = fmt.Sprintf("%s holds %v rooms (%v inflight), /debug/rooms lists %d%s", d.Name, held, inflight, len(rooms), ex)
				return false
			}
			return true
		}); !ok {
			leaks = append(leaks, last)
		}
	}
	return leaks
}

// GoroutinesBack waits (bounded) for each daemon's go_goroutines to come
// back within a small margin of its baseline.
func GoroutinesBack(ds []*Daemon, baseline map[string]float64, bound time.Duration) []string {
	var leaks []string
	for _, d := range ds {
		base := baseline[d.Name]
		limit := base + max(8, base/10)
		var last float64
		if _, ok := Eventually(bound, func() bool {
			last = d.Metric("go_goroutines", nil)
			return last >= 0 && last <= limit
		}); !ok {
			leaks = append(leaks, fmt.Sprintf("%s: %v goroutines, baseline %v", d.Name, last, base))
		}
	}
	return leaks
}
