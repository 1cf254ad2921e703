package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pdlink/pdlink/pkg/poll"
)

func newTable(t *testing.T) *poll.Table {
	t.Helper()
	cfg := poll.DefaultConfig(poll.Decode)
	tbl, err := poll.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func allSources(tbl *poll.Table, now *int64) Sources {
	return Sources{
		Rooms:          func() poll.Stats { return tbl.Stats(*now) },
		Frames:         func() []Count { return []Count{{[]string{"metadata", "in"}, 3}} },
		FramesRejected: func() []Count { return []Count{{[]string{"decode"}, 1}} },
		Retransmits:    func() float64 { return 2 },
		Unsent:         func() float64 { return 0 },
		WatchDropped:   func() float64 { return 0 },
		Peers:          func() []Count { return []Count{{[]string{"up"}, 1}, {[]string{"lost"}, 0}} },
		PeerDepartures: func() []Count {
			return []Count{{[]string{"goodbye"}, 1}, {[]string{"lost"}, 0}, {[]string{"restarted"}, 0}}
		},
		WorkerRestarts:    func() []Count { return []Count{{[]string{"listener"}, 0}} },
		TransferBytes:     func() float64 { return 4096 },
		RegionReplaced:    func() float64 { return 0 },
		RegionFaults:      func() float64 { return 0 },
		InsecureMode:      func() float64 { return 0 },
		AuthRejected:      func() []Count { return []Count{{[]string{"mac_invalid"}, 0}} },
		AuthReloads:       func() []Count { return []Count{{[]string{"ok"}, 0}} },
		RegionRefused:     func() []Count { return []Count{{[]string{"symlink"}, 0}} },
		PeerLayoutRefused: func() []Count { return []Count{{[]string{"dtype"}, 0}} },
		DataRefused:       func() []Count { return []Count{{[]string{"unknown_room"}, 0}} },
	}
}

func TestEveryNamedMetricIsExportedWithItsType(t *testing.T) {
	tbl := newTable(t)
	now := int64(0)
	reg := prometheus.NewRegistry()
	rec := NewRecorder(SideDecode)
	if err := Register(reg, NewCollector(SideDecode, allSources(tbl, &now)), rec); err != nil {
		t.Fatal(err)
	}
	// The daemon registers these two itself (internal/daemon); the scrape test of
	// internal/service checks them on real daemons.
	for _, n := range []string{"pdlink_build_info", "pdlink_data_transport_info"} {
		reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: n}))
	}
	rec.ObserveTransfer(0.01)
	mfs := gather(t, reg)
	for n, typ := range Names() {
		mf, ok := mfs[n]
		if !ok {
			t.Errorf("%s not exported", n)
			continue
		}
		if got := strings.ToLower(mf.GetType().String()); got != typ {
			t.Errorf("%s is %s, want %s", n, got, typ)
		}
	}
	for n, mf := range mfs {
		if _, ok := Names()[n]; !ok {
			t.Errorf("%s exported but not in Names()", n)
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetName(), "room") && l.GetName() != "reason" {
					t.Errorf("%s has a per-room label %s", n, l.GetName())
				}
			}
		}
	}
}

func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	mf, ok := mfs[name]
	if !ok {
		t.Fatalf("%s missing", name)
	}
next:
	for _, m := range mf.GetMetric() {
		for k, v := range labels {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("%s%v missing", name, labels)
	return 0
}

func TestRoomMetricsFollowTheTableAtScrapeTime(t *testing.T) {
	tbl := newTable(t)
	now := int64(0)
	reg := prometheus.NewRegistry()
	if err := Register(reg, NewCollector(SidePrefill, allSources(tbl, &now)), NewRecorder(SidePrefill)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if err := tbl.Step(now, poll.Event{Kind: poll.EvOpen, Key: poll.Key{Room: poll.RoomID(i), Nonce: poll.Nonce(i)}, Peer: 1}); err != nil {
			t.Fatal(err)
		}
	}
	tbl.Advance()
	now += int64(2 * time.Second)
	mfs := gather(t, reg)
	if v := value(t, mfs, "pdlink_inflight_rooms", nil); v != 3 {
		t.Errorf("inflight %v, want 3", v)
	}
	if v := value(t, mfs, "pdlink_rooms", map[string]string{"state": "Bootstrapping"}); v != 3 {
		t.Errorf("rooms{Bootstrapping} %v, want 3", v)
	}
	if v := value(t, mfs, "pdlink_room_oldest_age_seconds", map[string]string{"state": "Bootstrapping"}); v != 2 {
		t.Errorf("oldest age %v, want 2", v)
	}
	if v := value(t, mfs, "pdlink_room_transitions_total", map[string]string{"from": "", "to": "Bootstrapping"}); v != 3 {
		t.Errorf("opens %v, want 3", v)
	}
	// A failure reason series exists at zero before any failure, so rate()
	// in alerts works from the first scrape.
	if v := value(t, mfs, "pdlink_room_failures_total", map[string]string{"reason": "timeout:bootstrapping"}); v != 0 {
		t.Errorf("failures before timeout %v", v)
	}
	// Between ticks a room past its deadline shows as oldest age above the
	// deadline: that is what the "reaper broken" alert looks for.
	now += int64(time.Hour)
	mfs = gather(t, reg)
	if age, dl := value(t, mfs, "pdlink_room_oldest_age_seconds", map[string]string{"state": "Bootstrapping"}),
		value(t, mfs, "pdlink_room_deadline_seconds", map[string]string{"state": "Bootstrapping"}); age <= dl {
		t.Errorf("untick'd pin not visible: oldest %v <= deadline %v", age, dl)
	}
	tbl.Tick(now)
	tbl.Advance()
	mfs = gather(t, reg)
	if v := value(t, mfs, "pdlink_room_failures_total", map[string]string{"reason": "timeout:bootstrapping"}); v != 3 {
		t.Errorf("failures after timeout %v, want 3", v)
	}
	if v := value(t, mfs, "pdlink_inflight_rooms", nil); v != 0 {
		t.Errorf("inflight after timeout %v, want 0", v)
	}
}
