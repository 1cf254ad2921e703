package daemon

import (
	"errors"
	"testing"
)

func TestGroupFirstReturnStopsAllAndIsReturned(t *testing.T) {
	var g Group
	boom := errors.New("boom")
	stops := make([]chan struct{}, 3)
	for i := range stops {
		stops[i] = make(chan struct{})
	}
	interrupted := make(chan error, 3)
	g.Add(func() error { <-stops[0]; return nil }, func(err error) { interrupted <- err; close(stops[0]) })
	g.Add(func() error { return boom }, func(err error) { interrupted <- err })
	g.Add(func() error { <-stops[2]; return nil }, func(err error) { interrupted <- err; close(stops[2]) })
	if err := g.Run(); !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want boom", err)
	}
	close(interrupted)
	n := 0
	for err := range interrupted {
		n++
		if !errors.Is(err, boom) {
			t.Errorf("interrupt got %v", err)
		}
	}
	if n != 3 {
		t.Errorf("%d interrupts, want 3", n)
	}
}

func TestEmptyGroupReturns(t *testing.T) {
	var g Group
	if err := g.Run(); err != nil {
		t.Fatal(err)
	}
}
