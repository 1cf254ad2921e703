package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdlink/pdlink/pkg/poll"
)

// Count is one labelled counter value from a component.
type Count struct {
	Labels []string // values, in the order of the metric's label names
	Value  float64
}

// Sources are read at scrape time. Any nil func exports nothing for its
// metrics (a daemon exports only what it has).
type Sources struct {
	// Rooms snapshots the room table.
	Rooms func() poll.Stats
	// Frames returns control frames by (type, dir) with dir "in" or "out".
	Frames func() []Count
	// FramesRejected returns rejected control frames by (reason).
	FramesRejected func() []Count
	// Retransmits returns control frames sent again for lack of an ack.
	Retransmits func() float64
	// Unsent returns control frames the transport refused (its send queue
	// full behind a slow peer, or the socket closed); a reliable one goes
	// again at its retransmit.
	Unsent func() float64
	// Peers returns peers by (state), e.g. "up", "lost".
	Peers func() []Count
	// PeerDepartures returns peers that went away, by (reason): "goodbye"
	// (a planned stop the peer announced), "lost" (heartbeats missed),
	// "restarted" (a new instance took its place).
	PeerDepartures func() []Count
	// WorkerRestarts returns supervised goroutine restarts by (worker).
	WorkerRestarts func() []Count
	// TransferBytes returns KV bytes moved by this side (sent on prefill,
	// written on decode).
	TransferBytes func() float64
	// RegionReplaced returns region files found replaced: a new file
	// registered for a rank, a rank unregistered, or a file seen replaced
	// at a bind or Send before the engine registered it (once per
	// generation).
	RegionReplaced func() float64
	// RegionFaults returns faults on mapped region memory (a region file
	// truncated while its pages were copied) recovered into room failures.
	RegionFaults func() float64
	// InsecureMode is 1 when the daemon runs without a shared secret on
	// addresses other hosts can reach (--insecure).
	InsecureMode func() float64
	// AuthRejected returns frames and data connections refused by the
	// authentication layer, by (reason); AuthReloads token reloads by
	// (result) "ok" or "error".
	AuthRejected func() []Count
	AuthReloads  func() []Count
	// RegionRefused returns RegisterRegion paths refused, by the (rule)
	// they broke (pkg/regionpath's closed set).
	RegionRefused func() []Count
	// PeerLayoutRefused returns decode peer layouts the prefill side could
	// not map onto its own, by (reason) (transfer.RefusalReasons); once per
	// pair of layouts, not per room.
	PeerLayoutRefused func() []Count
	// DataRefused returns data frames decode's receiver refused, by (reason)
	// (transfer.AllRefusals: unknown_room, invalid, bad_frame, checksum).
	DataRefused func() []Count
	// WatchDropped returns the transitions dropped for Watch subscribers
	// too slow to take them (each told so by a "missed" event).
	WatchDropped func() float64
}

// Side label values.
const (
	SidePrefill = "prefill"
	SideDecode  = "decode"
)

func name(n string) string { return "pdlink_" + n }

func stateLabel(s poll.State) string { return s.String() }

// Collector reads Sources on every scrape.
type Collector struct {
	src   Sources
	moves map[[2]poll.State]bool // transitions the move table allows

	inflight, rooms, oldest, overdue, deadline, tombstones *prometheus.Desc
	transitions, failures, rejectedEvents, collisions      *prometheus.Desc
	reaped                                                 *prometheus.Desc
	frames, framesRejected, retransmits, peers, restarts   *prometheus.Desc
	unsent, watchDropped                                   *prometheus.Desc
	peerDepartures                                         *prometheus.Desc
	transferBytes, insecure                                *prometheus.Desc
	regionReplaced, regionFaults                           *prometheus.Desc
	authRejected, authReloads                              *prometheus.Desc
	regionRefused, peerLayoutRefused                       *prometheus.Desc
	dataRefused                                            *prometheus.Desc
}

// NewCollector builds the scrape-time collector for one daemon side.
func NewCollector(side string, src Sources) *Collector {
	cl := prometheus.Labels{"side": side}
	d := func(n, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name(n), help, labels, cl)
	}
	moves := map[[2]poll.State]bool{}
	for _, from := range poll.AllStates() {
		for k := 0; k < 256; k++ {
			if to, ok := poll.Legal(from, poll.EventKind(k)); ok && to != from && to != poll.StateNone {
				moves[[2]poll.State{from, to}] = true
			}
		}
	}
	return &Collector{
		src:               src,
		moves:             moves,
		inflight:          d("inflight_rooms", "Rooms not yet in a terminal state."),
		rooms:             d("rooms", "Rooms held, by state (terminal rooms wait for Clear).", "state"),
		oldest:            d("room_oldest_age_seconds", "Age of the oldest room in each state, measured from when it entered the state (Transferring: from its last progress).", "state"),
		overdue:           d("rooms_overdue", "Rooms past the overdue fraction of their state's deadline.", "state"),
		deadline:          d("room_deadline_seconds", "Deadline of each state (clear linger for terminal states); a room older than this is a pin.", "state"),
		tombstones:        d("tombstones", "Abort and ended tombstones held."),
		transitions:       d("room_transitions_total", "Room state transitions; from=\"\" counts opens.", "from", "to"),
		failures:          d("room_failures_total", "Rooms failed, by reason.", "reason"),
		rejectedEvents:    d("room_events_rejected_total", "Room events refused by the state machine, by reason.", "reason"),
		collisions:        d("room_collisions_total", "Room id collisions: opens refused because another request holds the id, peer frames naming another request's room (detected here), rooms the peer failed for a collision (told)."),
		reaped:            d("rooms_reaped_total", "Terminal rooms removed without Clear, by reason.", "reason"),
		frames:            d("frames_total", "Control frames, by type and direction.", "type", "dir"),
		framesRejected:    d("frames_rejected_total", "Control frames rejected, by reason.", "reason"),
		retransmits:       d("frames_retransmitted_total", "Control frames sent again for lack of an ack."),
		unsent:            d("frames_unsent_total", "Control frames the transport refused: its send queue full behind a slow peer, or the socket closed (a reliable frame goes again at its retransmit)."),
		watchDropped:      d("watch_dropped_total", "Room transitions dropped for Watch subscribers too slow to take them; each stream is told how many it missed and re-syncs with Poll."),
		peers:             d("peers", "Peer daemons, by state.", "state"),
		peerDepartures:    d("peer_departures_total", "Peers that went away, by reason: goodbye (a planned stop), lost (heartbeats missed), restarted (a new instance behind the same address).", "reason"),
		restarts:          d("worker_restarts_total", "Supervised goroutines restarted after a failure, by worker.", "worker"),
		transferBytes:     d("transfer_bytes_total", "KV bytes moved (sent on prefill, written and verified on decode)."),
		regionReplaced:    d("region_replaced_total", "Region files found replaced, each generation once: a new file registered for a rank, a rank unregistered, or a file seen replaced before the engine registered it (at a bind or Send, or on prefill when decoded's same-host stat of the file did). The rooms it failed count in room_failures_total{reason=\"region_replaced\"}."),
		regionFaults:      d("region_faults_total", "Faults on mapped region memory (the region file truncated while its pages were copied), each recovered into a room failure with reason transfer_error instead of a crash."),
		insecure:          d("insecure_mode", "1 when the daemon is reachable from other hosts without a shared secret (--insecure)."),
		authRejected:      d("auth_rejected_total", "Control frames and data connections refused by authentication, by reason.", "reason"),
		authReloads:       d("auth_token_reloads_total", "Token file reloads (SIGHUP), by result.", "result"),
		peerLayoutRefused: d("peer_layout_refused_total", "Decode peer layouts (from REGISTER) that cannot map onto this side's, by the reason pkg/rankmap or the opaque comparison gave: page_size, dtype, head_count, tp_not_divisible, opaque_tp, ...; counted once per pair of layouts, and each room bound to the peer then fails with reason invalid.", "reason"),
		dataRefused:       d("data_refused_total", "Data frames decode's receiver refused, by reason: unknown_room (a stream's DONE for a key not expected: never, when the daemons planned the room's streams apart, or no longer, after its fence), invalid (a chunk or DONE that did not match its room, which failed invalid), bad_frame (a header, frame type, run list or shm offer that failed its checks; the connection broke), checksum (a chunk or aux row, sent or copied on the same host, that failed its crc32c; the room failed checksum). Each is logged, rate limited per reason.", "reason"),
		regionRefused:     d("region_refused_total", "RegisterRegion paths refused (PermissionDenied), by the rule they broke: relative, not_clean, outside_dirs, symlink, not_regular, group, changed.", "rule"),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.inflight, c.rooms, c.oldest, c.overdue, c.deadline, c.tombstones,
		c.transitions, c.failures, c.rejectedEvents, c.collisions, c.reaped, c.frames, c.framesRejected,
		c.retransmits, c.unsent, c.watchDropped, c.peers, c.peerDepartures, c.restarts, c.transferBytes, c.regionReplaced, c.regionFaults, c.insecure, c.authRejected, c.authReloads, c.regionRefused, c.peerLayoutRefused, c.dataRefused} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	if c.src.Rooms != nil {
		s := c.src.Rooms()
		gauge(c.inflight, float64(s.Inflight))
		gauge(c.tombstones, float64(s.Tombstones))
		counter(c.collisions, float64(s.Collisions))
		counter(c.reaped, float64(s.ReapedUncleared), "uncleared")
		states := poll.AllStates()
		for _, st := range states {
			l := stateLabel(st)
			gauge(c.rooms, float64(s.Count(st)), l)
			gauge(c.oldest, s.OldestAge(st).Seconds(), l)
			gauge(c.overdue, float64(s.Overdue(st)), l)
			gauge(c.deadline, s.Deadline(st).Seconds(), l)
		}
		for _, to := range states {
			counter(c.transitions, float64(s.Transitions(poll.StateNone, to)), "", stateLabel(to))
			for _, from := range states {
				if from.Terminal() {
					continue
				}
				if c.moves[[2]poll.State{from, to}] {
					counter(c.transitions, float64(s.Transitions(from, to)), stateLabel(from), stateLabel(to))
				}
			}
		}
		for _, r := range poll.AllReasons() {
			counter(c.failures, float64(s.Failures(r)), string(r))
		}
		for _, r := range poll.AllRejectReasons() {
			counter(c.rejectedEvents, float64(s.Rejected(r)), r.String())
		}
	}
	emit := func(f func() []Count, d *prometheus.Desc, vt prometheus.ValueType) {
		if f == nil {
			return
		}
		for _, cnt := range f() {
			ch <- prometheus.MustNewConstMetric(d, vt, cnt.Value, cnt.Labels...)
		}
	}
	emit(c.src.Frames, c.frames, prometheus.CounterValue)
	emit(c.src.FramesRejected, c.framesRejected, prometheus.CounterValue)
	emit(c.src.Peers, c.peers, prometheus.GaugeValue)
	emit(c.src.PeerDepartures, c.peerDepartures, prometheus.CounterValue)
	emit(c.src.WorkerRestarts, c.restarts, prometheus.CounterValue)
	emit(c.src.AuthRejected, c.authRejected, prometheus.CounterValue)
	emit(c.src.AuthReloads, c.authReloads, prometheus.CounterValue)
	emit(c.src.RegionRefused, c.regionRefused, prometheus.CounterValue)
	emit(c.src.PeerLayoutRefused, c.peerLayoutRefused, prometheus.CounterValue)
	emit(c.src.DataRefused, c.dataRefused, prometheus.CounterValue)
	if c.src.Retransmits != nil {
		counter(c.retransmits, c.src.Retransmits())
	}
	if c.src.Unsent != nil {
		counter(c.unsent, c.src.Unsent())
	}
	if c.src.WatchDropped != nil {
		counter(c.watchDropped, c.src.WatchDropped())
	}
	if c.src.TransferBytes != nil {
		counter(c.transferBytes, c.src.TransferBytes())
	}
	if c.src.RegionReplaced != nil {
		counter(c.regionReplaced, c.src.RegionReplaced())
	}
	if c.src.RegionFaults != nil {
		counter(c.regionFaults, c.src.RegionFaults())
	}
	if c.src.InsecureMode != nil {
		gauge(c.insecure, c.src.InsecureMode())
	}
}

// Recorder holds the histograms observed as things happen.
type Recorder struct {
	roomDuration     *prometheus.HistogramVec
	transferDuration prometheus.Histogram
}

// NewRecorder builds the histograms for one side.
func NewRecorder(side string) *Recorder {
	cl := prometheus.Labels{"side": side}
	return &Recorder{
		roomDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        name("room_duration_seconds"),
			Help:        "Time from open to a terminal state, by outcome (success or failed).",
			ConstLabels: cl,
			Buckets:     prometheus.ExponentialBuckets(0.001, 2, 18), // 1ms .. ~2m
		}, []string{"outcome"}),
		transferDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        name("transfer_duration_seconds"),
			Help:        "Time from a room's first KV byte to its last.",
			ConstLabels: cl,
			Buckets:     prometheus.ExponentialBuckets(0.0005, 2, 18),
		}),
	}
}

// ObserveRoomEnd records a room reaching a terminal state.
func (r *Recorder) ObserveRoomEnd(success bool, seconds float64) {
	outcome := "failed"
	if success {
		outcome = "success"
	}
	r.roomDuration.WithLabelValues(outcome).Observe(seconds)
}

// ObserveTransfer records one room's data transfer time.
func (r *Recorder) ObserveTransfer(seconds float64) { r.transferDuration.Observe(seconds) }

// Register adds the collector and the recorder to reg; both outcomes are
// created at zero so the series exist before the first room ends.
func Register(reg prometheus.Registerer, c *Collector, r *Recorder) error {
	r.roomDuration.WithLabelValues("success")
	r.roomDuration.WithLabelValues("failed")
	for _, col := range []prometheus.Collector{c, r.roomDuration, r.transferDuration} {
		if err := reg.Register(col); err != nil {
			return err
		}
	}
	return nil
}

// Names lists every metric name this package can export, with its type, so
// tests (scrape test, Grafana and alert rule checks) can hold the daemons
// and the deploy files to it.
func Names() map[string]string {
	return map[string]string{
		name("inflight_rooms"):             "gauge",
		name("rooms"):                      "gauge",
		name("room_oldest_age_seconds"):    "gauge",
		name("rooms_overdue"):              "gauge",
		name("room_deadline_seconds"):      "gauge",
		name("tombstones"):                 "gauge",
		name("room_transitions_total"):     "counter",
		name("room_failures_total"):        "counter",
		name("room_events_rejected_total"): "counter",
		name("room_collisions_total"):      "counter",
		name("rooms_reaped_total"):         "counter",
		name("frames_total"):               "counter",
		name("frames_rejected_total"):      "counter",
		name("frames_retransmitted_total"): "counter",
		name("frames_unsent_total"):        "counter",
		name("watch_dropped_total"):        "counter",
		name("peers"):                      "gauge",
		name("peer_departures_total"):      "counter",
		name("worker_restarts_total"):      "counter",
		name("transfer_bytes_total"):       "counter",
		name("region_replaced_total"):      "counter",
		name("region_faults_total"):        "counter",
		name("insecure_mode"):              "gauge",
		name("auth_rejected_total"):        "counter",
		name("auth_token_reloads_total"):   "counter",
		name("region_refused_total"):       "counter",
		name("peer_layout_refused_total"):  "counter",
		name("data_refused_total"):         "counter",
		name("room_duration_seconds"):      "histogram",
		name("transfer_duration_seconds"):  "histogram",
		name("build_info"):                 "gauge",
		name("data_transport_info"):        "gauge",
	}
}

// IsPdlinkName reports whether a metric name belongs to pdlink.
func IsPdlinkName(n string) bool { return strings.HasPrefix(n, "pdlink_") }
