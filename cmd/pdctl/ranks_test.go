package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
)

// A run in which every room failed is an error naming what the daemons
// said, prefilld's own refusal included: the scheduler API fails such a
// room just "invalid", and only prefilld's log says which mapping it
// cannot serve. A run with one success is not an error.
func TestNoRoomSucceededNamesTheOutcomesAndPrefilldsRefusal(t *testing.T) {
	const why = "rank mapping mha 3 -> 2: heads do not divide"
	// A stand-in for prefilld: it logs what the real one logs when it
	// refuses to bind a room, and serves nothing.
	script := `echo '{"msg":"serving","grpc":"x","http":"y"}' >&2
echo '{"msg":"cannot bind room to decode peer","error":"` + why + `"}' >&2
exec sleep 60`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pre, err := proc.Start(ctx, "/bin/sh", []string{"-c", script}, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pre.Kill()
	// LogField reads what the scanner has taken in: the refusal comes
	// right after "serving".
	if _, ok := testbed.Eventually(10*time.Second, func() bool { return pre.LogField("cannot bind room to decode peer", "error") != "" }); !ok {
		t.Fatal("the stand-in's refusal line was never read")
	}

	failed := &sim.Report{Requests: 4, Outcomes: map[string]int{"prefill:invalid": 4, "decode:timeout:bootstrapping": 4},
		FirstError: "InvalidArgument: layout"}
	err = noRoomSucceeded(failed, []*proc.Process{pre})
	if err == nil {
		t.Fatal("a run with no room succeeded is not an error")
	}
	for _, want := range []string{"no room succeeded", "decode:timeout:bootstrapping x4", "prefill:invalid x4",
		"first refusal: InvalidArgument: layout", why} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	one := &sim.Report{Requests: 4, Outcomes: map[string]int{"decode:success": 1, "decode:timeout:bootstrapping": 3}}
	if err := noRoomSucceeded(one, []*proc.Process{pre}); err != nil {
		t.Errorf("a run with a success: %v", err)
	}
	if err := noRoomSucceeded(&sim.Report{}, nil); err != nil {
		t.Errorf("a run of no requests: %v", err)
	}
}
