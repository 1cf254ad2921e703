package main

import (
	"strings"
	"testing"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
)

// What pdctl prints is what it accepts back, and so are the metric label
// and the gRPC name of every state.
func TestStateFlagAcceptsWhatPdctlPrintsTheMetricLabelAndTheGRPCName(t *testing.T) {
	metricLabel := map[pb.RoomState]string{
		pb.RoomState_ROOM_STATE_BOOTSTRAPPING:     "Bootstrapping",
		pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT: "WaitingForInput",
		pb.RoomState_ROOM_STATE_TRANSFERRING:      "Transferring",
		pb.RoomState_ROOM_STATE_SUCCESS:           "Success",
		pb.RoomState_ROOM_STATE_FAILED:            "Failed",
	}
	for v, name := range pb.RoomState_name {
		want := pb.RoomState(v)
		if want == pb.RoomState_ROOM_STATE_UNSPECIFIED {
			continue
		}
		label, ok := metricLabel[want]
		if !ok {
			t.Errorf("%s has no metric label in this test", name)
		}
		for _, s := range []string{stateName(want), name, label, strings.ToUpper(stateName(want))} {
			got, err := parseState(s)
			if err != nil || got != want {
				t.Errorf("parseState(%q) = %v, %v; want %v", s, got, err, want)
			}
		}
	}
	if st, err := parseState(""); err != nil || st != pb.RoomState_ROOM_STATE_UNSPECIFIED {
		t.Errorf("parseState(\"\") = %v, %v; want every state", st, err)
	}
	if _, err := parseState("waiting"); err == nil || !strings.Contains(err.Error(), "waiting_for_input") {
		t.Errorf("parseState(waiting) = %v; want an error listing the states", err)
	}
}
