package main

import (
	"bytes"
	"strings"
	"testing"
)

// Outside a terminal the demo's progress is a line every tenth of the
// rooms, never a carriage-return bar (which made one 15 KB line of every
// CI log), and a count reported late by a slower room's goroutine is not
// printed after a higher one.
func TestDemoProgressOutsideATerminalIsALineEveryTenth(t *testing.T) {
	var out bytes.Buffer
	p := progressPrinter(&out)
	const total = 300
	for done := 1; done <= total; done++ {
		p(done, total)
		if done%7 == 0 {
			p(done-1, total) // a room that ended earlier reports late
		}
	}
	s := out.String()
	if strings.Contains(s, "\r") {
		t.Fatalf("carriage return in non-terminal output: %q", s)
	}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) != 10 || lines[len(lines)-1] != "300/300 rooms" {
		t.Fatalf("got %d lines ending %q, want 10 ending 300/300 rooms:\n%s", len(lines), lines[len(lines)-1], s)
	}
}
