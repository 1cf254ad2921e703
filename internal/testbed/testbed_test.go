package testbed

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/sim"
)

func TestTimingsAreFlagsAndBoundsFollowThem(t *testing.T) {
	tm := ShortTimings()
	args := strings.Join(tm.Args(), " ")
	for _, want := range []string{"--bootstrap-timeout=2s", "--waiting-timeout=2s", "--transfer-idle-timeout=2s",
		"--clear-linger=3s", "--heartbeat-interval=200ms", "--heartbeat-misses=3"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	if got := tm.PeerBound(); got != 1600*time.Millisecond {
		t.Errorf("PeerBound = %v, want 3 x 200ms + 1s", got)
	}
	tm.Idle = 5 * time.Second
	if got := tm.RoomBound(); got != 2*time.Second+2*time.Second+5*time.Second+1600*time.Millisecond+2*time.Second {
		t.Errorf("RoomBound = %v, want every deadline, the peer bound and 2s", got)
	}
}

func TestPinReplacesOnlyTheFlagAndLeavesTheInputAlone(t *testing.T) {
	in := []string{"--http-listen=127.0.0.1:0", "--http-listen-extra=1", "--data-listen=127.0.0.1:0"}
	out := Pin(in, "--http-listen", "127.0.0.1:9400")
	if want := []string{"--http-listen=127.0.0.1:9400", "--http-listen-extra=1", "--data-listen=127.0.0.1:0"}; !slices.Equal(out, want) {
		t.Errorf("Pin = %v, want %v", out, want)
	}
	if in[0] != "--http-listen=127.0.0.1:0" {
		t.Errorf("Pin changed its input: %v", in)
	}
}

// fakeDaemon serves /metrics and /debug/rooms as a daemon would.
func fakeDaemon(t *testing.T, name, metrics, rooms string) *Daemon {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprint(w, metrics)
		case "/debug/rooms":
			fmt.Fprint(w, rooms)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return &Daemon{Name: name, HTTP: strings.TrimPrefix(srv.URL, "http://"), Client: srv.Client()}
}

const exposition = `# TYPE pdlink_room_transitions_total counter
pdlink_room_transitions_total{from="",side="decode",to="Bootstrapping"} 5
pdlink_room_transitions_total{from="Bootstrapping",side="decode",to="Failed"} 2
pdlink_room_transitions_total{from="Transferring",side="decode",to="Success"} 3
# TYPE pdlink_rooms gauge
pdlink_rooms{side="decode",state="Success"} 0
pdlink_rooms{side="decode",state="Failed"} 0
# TYPE pdlink_inflight_rooms gauge
pdlink_inflight_rooms{side="decode"} 0
# TYPE go_goroutines gauge
go_goroutines 40
`

func TestMetricSumsTheSamplesWhoseLabelsMatch(t *testing.T) {
	d := fakeDaemon(t, "decoded", exposition, `{"rooms":[]}`)
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{nil, 10},
		{map[string]string{"from": ""}, 5},
		{map[string]string{"to": "Success"}, 3},
		{map[string]string{"to": "Success", "side": "prefill"}, 0},
		{map[string]string{"reason": ""}, 0},
	} {
		if got := d.Metric("pdlink_room_transitions_total", c.labels); got != c.want {
			t.Errorf("Metric(transitions, %v) = %v, want %v", c.labels, got, c.want)
		}
	}
	if got := (&Daemon{Name: "gone", HTTP: "127.0.0.1:1", Client: http.DefaultClient}).Metric("go_goroutines", nil); got != -1 {
		t.Errorf("Metric of a daemon that does not answer = %v, want -1", got)
	}
}

// With debugRooms a room /debug/rooms still lists is a leak though the
// gauges read 0; without, only the gauges count.
func TestTablesEmptyReadsDebugRoomsOnlyWhenAsked(t *testing.T) {
	d := fakeDaemon(t, "decoded", exposition, `{"rooms":[{"room":7,"state":"Failed","visible_state":"Failed","reason":"peer_lost"}]}`)
	if leaks := TablesEmpty([]*Daemon{d}, 100*time.Millisecond, false); len(leaks) != 0 {
		t.Errorf("gauges at 0, without debugRooms: leaks %v", leaks)
	}
	leaks := TablesEmpty([]*Daemon{d}, 100*time.Millisecond, true)
	if len(leaks) != 1 || !strings.Contains(leaks[0], "room 7 Failed/Failed peer_lost") {
		t.Errorf("room 7 listed, with debugRooms: leaks %v", leaks)
	}
}

func TestGoroutinesBackAllowsASmallMarginOverBaseline(t *testing.T) {
	d := fakeDaemon(t, "decoded", exposition, `{"rooms":[]}`)
	if leaks := GoroutinesBack([]*Daemon{d}, map[string]float64{"decoded": 32}, 100*time.Millisecond); len(leaks) != 0 {
		t.Errorf("40 goroutines on a baseline of 32 (margin 8): leaks %v", leaks)
	}
	if leaks := GoroutinesBack([]*Daemon{d}, map[string]float64{"decoded": 31}, 100*time.Millisecond); len(leaks) != 1 {
		t.Errorf("40 goroutines on a baseline of 31 (margin 8): leaks %v", leaks)
	}
}

func TestKillOutcomesAcceptTheSurvivorsFailuresOnly(t *testing.T) {
	for _, c := range []struct {
		outcome       string
		transferError bool
		want          bool
	}{
		{"decode:success", false, true},
		{"prefill:unreachable:unavailable", false, true},
		{"decode:not_found", false, true},
		{"open_error:unavailable", false, true},
		{"open_error:internal", false, false},
		{"prefill:peer_lost", false, true},
		{"prefill:peer_restarted", false, true},
		{"prefill:timeout:bootstrapping", false, true},
		{"prefill:aborted:remote", false, true},
		{"decode:peer_lost", false, false},
		{"prefill:transfer_error", false, false},
		{"prefill:transfer_error", true, true},
		{"decode:transfer_error", true, false},
		{"prefill:invalid", true, false},
	} {
		if got := KillOutcomes("prefill", c.transferError)(c.outcome); got != c.want {
			t.Errorf("KillOutcomes(prefill, %v)(%s) = %v, want %v", c.transferError, c.outcome, got, c.want)
		}
	}
}

func TestMergeAddsEveryCountAndKeepsTheWorst(t *testing.T) {
	rep := func(n int, worst time.Duration) *sim.Report {
		return &sim.Report{Requests: n, Outcomes: map[string]int{"decode:success": n}, Faults: map[string]int{"abort": 1},
			FaultOutcomes: map[string]int{"abort -> decode:aborted:local": 1}, CleanFailed: map[string]int{"decode:invalid": 1},
			Verified: n, Corrupt: 1, LateWrites: 1, Crossed: 1, Pinned: 1, Bytes: 10, Elapsed: time.Second,
			LastChunkToSuccess: []time.Duration{worst}, WorstTerminal: worst}
	}
	got := Merge(rep(3, time.Second), rep(4, 2*time.Second))
	if got.Requests != 7 || got.Outcomes["decode:success"] != 7 || got.Faults["abort"] != 2 ||
		got.FaultOutcomes["abort -> decode:aborted:local"] != 2 || got.CleanFailed["decode:invalid"] != 2 ||
		got.Verified != 7 || got.Corrupt != 2 || got.LateWrites != 2 || got.Crossed != 2 || got.Pinned != 2 ||
		got.Bytes != 20 || got.Elapsed != 2*time.Second || len(got.LastChunkToSuccess) != 2 || got.WorstTerminal != 2*time.Second {
		t.Errorf("Merge = %+v", got)
	}
	if s := Outcomes(got); s != "decode:success=7" {
		t.Errorf("Outcomes = %q", s)
	}
}

// fakeDaemonScript logs "serving" with the HTTP address its
// --http-listen names, or 127.0.0.1:4242 for port 0, and stays up.
const fakeDaemonScript = `h=${1#--http-listen=}; case $h in *:0) h=127.0.0.1:4242;; esac
printf '{"msg":"serving","grpc":"x.sock","http":"%s"}\n' "$h" >&2; exec sleep 60`

func TestRestartRunsThePinnedArgumentsAgain(t *testing.T) {
	d := Start(t, "fake", "sh", []string{"-c", fakeDaemonScript, "sh", "--http-listen=127.0.0.1:0", "--data-listen=127.0.0.1:0"}, Options{})
	if d.HTTP != "127.0.0.1:4242" {
		t.Fatalf("HTTP = %q, want the address it logged", d.HTTP)
	}
	d.Pin("--data-listen", "127.0.0.1:9500")
	first := d.Proc()
	d.Kill9()
	select {
	case <-first.Exited():
	default:
		t.Fatal("Kill9 returned before the child was reaped")
	}
	d.Restart(t)
	if d.Proc() == first {
		t.Fatal("Restart kept the old process")
	}
	want := []string{"-c", fakeDaemonScript, "sh", "--http-listen=127.0.0.1:4242", "--data-listen=127.0.0.1:9500"}
	if got := d.Proc().Args; !slices.Equal(got, want) {
		t.Errorf("restarted with %q, want %q", got, want)
	}
	if got := d.Proc().HTTPAddr; got != "127.0.0.1:4242" {
		t.Errorf("restarted daemon serves HTTP on %q, want the pinned 127.0.0.1:4242", got)
	}
	if !d.WaitLogged("serving", time.Second) || d.WaitLogged("serv", 100*time.Millisecond) {
		t.Errorf("WaitLogged matches the message exactly: serving logged, serv not")
	}
}
