package poll

import (
	"fmt"
	"strings"
	"unicode"
)

// ParseState reads a room state the way an operator types it, in any
// case: the metric label ("WaitingForInput"), its snake form
// ("waiting_for_input", what pdctl prints), its kebab form
// ("waiting-for-input") or the gRPC enum name
// ("ROOM_STATE_WAITING_FOR_INPUT"). Anything else, StateNone included, is
// ErrUnknownState with the accepted names in the message.
func ParseState(s string) (State, error) {
	for _, st := range AllStates() {
		for _, spelling := range StateSpellings(st) {
			if strings.EqualFold(s, spelling) {
				return st, nil
			}
		}
	}
	return StateNone, fmt.Errorf("%w %q: want one of %s (any case; also the snake, kebab or ROOM_STATE_ form)",
		ErrUnknownState, s, strings.Join(SnakeStateNames(), ", "))
}

// StateSpellings lists the names ParseState accepts for st: the metric
// label, snake, kebab and gRPC enum forms.
func StateSpellings(st State) []string {
	snake := SnakeStateName(st)
	return []string{st.String(), snake, strings.ReplaceAll(snake, "_", "-"), "ROOM_STATE_" + strings.ToUpper(snake)}
}

// SnakeStateName is st in snake case ("waiting_for_input"), the form pdctl
// prints.
func SnakeStateName(st State) string {
	var b strings.Builder
	for i, r := range st.String() {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// SnakeStateNames lists every room state in snake case, in AllStates order.
func SnakeStateNames() []string {
	var out []string
	for _, st := range AllStates() {
		out = append(out, SnakeStateName(st))
	}
	return out
}
