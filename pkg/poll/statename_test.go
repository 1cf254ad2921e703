package poll

import (
	"errors"
	"strings"
	"testing"
)

// An operator may type a state the way pdctl prints it, the way the
// metrics label it or the way the gRPC enum names it; all mean one state.
func TestParseStateAcceptsEverySpellingAnOperatorSees(t *testing.T) {
	cases := map[string]State{
		"WaitingForInput":              WaitingForInput,
		"waiting_for_input":            WaitingForInput,
		"waiting-for-input":            WaitingForInput,
		"ROOM_STATE_WAITING_FOR_INPUT": WaitingForInput,
		"waitingforinput":              WaitingForInput,
		"WAITING_FOR_INPUT":            WaitingForInput,
		"room_state_failed":            Failed,
		"Bootstrapping":                Bootstrapping,
		"transferring":                 Transferring,
		"SUCCESS":                      Success,
	}
	for in, want := range cases {
		got, err := ParseState(in)
		if err != nil || got != want {
			t.Errorf("ParseState(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, st := range AllStates() {
		for _, s := range StateSpellings(st) {
			if got, err := ParseState(s); err != nil || got != st {
				t.Errorf("ParseState(%q) = %v, %v; want %v", s, got, err, st)
			}
		}
	}
}

func TestParseStateRefusesNonStatesListingTheAcceptedNames(t *testing.T) {
	for _, in := range []string{"", "NotFound", "ROOM_STATE_UNSPECIFIED", "waiting", "waiting__for_input", "State(9)", "9"} {
		st, err := ParseState(in)
		if !errors.Is(err, ErrUnknownState) || st != StateNone {
			t.Errorf("ParseState(%q) = %v, %v; want ErrUnknownState", in, st, err)
			continue
		}
		if !strings.Contains(err.Error(), "bootstrapping, waiting_for_input, transferring, success, failed") {
			t.Errorf("ParseState(%q) error %q does not list the states", in, err)
		}
	}
}
