package transfer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

// observedReceiver is rawReceiver with its log lines (info and up) kept.
func observedReceiver(t *testing.T, l Layout) (*Receiver, *observer.ObservedLogs, string) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	rcv, _, _, addr := rawReceiver(t, l, ReceiverConfig{Logger: zap.New(core)})
	return rcv, logs, addr
}

// refusalLine is the one "data frame refused" line, checked for its reason, the remote end
// and (but for a bad header, whose fields cannot be trusted) the room; its fields by key.
func refusalLine(t *testing.T, logs *observer.ObservedLogs, level zapcore.Level, reason Refusal) map[string]any {
	t.Helper()
	lines := logs.FilterMessage("data frame refused").All()
	if len(lines) != 1 {
		t.Fatalf("%d \"data frame refused\" lines, want 1: %v", len(lines), logs.All())
	}
	l := lines[0]
	f := l.ContextMap()
	if l.Level != level || f["reason"] != reason.String() || f["remote"] == "" || (f["room"] == nil) != (reason == RefusedBadFrame) {
		t.Fatalf("refusal logged at %v with %v, want %v naming reason %v, the remote end and the room", l.Level, f, level, reason)
	}
	if reason != RefusedBadFrame {
		wantKeyFields(t, f)
	}
	return f
}

// The shape of issue 14's bug: decode expects a rank's head slices from prefill rank 0 (a
// key naming it), prefill sends that rank whole pages under the decode rank's key alone.
// The DONE is refused as unknown_room, counted, and logged at info with the room, the
// remote end and the keys decode expects for that rank instead; the sender learns fenced.
func TestStreamUnderAnotherKeyIsRefusedCountedAndLoggedWithWhatWasExpected(t *testing.T) {
	l := UniformLayout(1, 8, 256, 1, 16)
	rcv, logs, addr := observedReceiver(t, l)
	sent := Key{Room: 5, Nonce: 9, Rank: Rank{TP: 1, Size: 4}}
	expected := sent
	expected.From = Rank{TP: 0, Size: 2}
	whole := []rankmap.Copy{{Heads: 1, HeadBytes: 64, PageTokens: 4, SrcRow: 64, DstRow: 64}}
	dst := [][]Run{{{2, 1}}}
	if err := rcv.Expect(Expectation{Key: expected, Dst: dst, AuxRow: 0, Copies: whole}); err != nil {
		t.Fatal(err)
	}
	var te *Error
	if err := sendOnce(t, l, addr, SenderConfig{}, sent, dst, bytes.Repeat([]byte{1}, 16)); !errors.As(err, &te) || te.Reason != ReasonFenced {
		t.Fatalf("sender's outcome %v, want fenced", err)
	}
	if n := rcv.Refused(RefusedUnknownRoom); n != 1 {
		t.Fatalf("unknown_room refusals %d, want 1", n)
	}
	f := refusalLine(t, logs, zapcore.InfoLevel, RefusedUnknownRoom)
	_, from := f["from_rank"]
	if f["room"] != sent.Room || f["nonce"] != sent.Nonce || f["rank"] != "1/4" || from || !strings.Contains(f["expected"].(string), expected.String()) {
		t.Fatalf("refusal names room %v nonce %v rank %v from_rank %v and expected %v; want %v and %v",
			f["room"], f["nonce"], f["rank"], f["from_rank"], f["expected"], sent, expected)
	}
}

// A chunk that does not match its room (whole pages for a room of head slices) fails the
// room invalid: counted as an invalid refusal and logged at warn with the room and the
// remote end, and the room's own failure line names the remote end too.
func TestChunkRefusedInvalidIsCountedAndLoggedWithRoomAndPeer(t *testing.T) {
	l := UniformLayout(2, 8, 512, 1, 16)
	rcv, logs, addr := observedReceiver(t, l)
	if err := rcv.Expect(Expectation{Key: fuzzSlicedKey, Dst: [][]Run{{{6, 1}}, {{7, 1}}}, AuxRow: -1, Copies: fuzzSlices}); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, addr)
	page := bytes.Repeat([]byte{3}, 512)
	c.write(append(chunkHeader(fuzzSlicedKey, 0, 0, []Run{{6, 1}}, 512, page), page...))
	if res := c.sync(); res[fuzzSlicedKey] != uint32(codeInvalid) {
		t.Fatalf("result %d, want invalid", res[fuzzSlicedKey])
	}
	if n := rcv.Refused(RefusedInvalid); n != 1 {
		t.Fatalf("invalid refusals %d, want 1", n)
	}
	f := refusalLine(t, logs, zapcore.WarnLevel, RefusedInvalid)
	if !strings.Contains(f["error"].(string), ErrSliceMismatch.Error()) {
		t.Fatalf("refusal error %q, want the slice mismatch", f["error"])
	}
	failed := logs.FilterMessage("room failed").All()
	if len(failed) != 1 || failed[0].ContextMap()["remote"] == nil {
		t.Fatalf("room failure lines %v, want one naming the remote end", failed)
	}
	wantKeyFields(t, failed[0].ContextMap())
}

// A frame header that fails its checks breaks the connection: counted bad_frame, logged
// at warn.
func TestBadFrameHeaderIsCountedAndLogged(t *testing.T) {
	rcv, logs, addr := observedReceiver(t, UniformLayout(1, 8, 256, 1, 16))
	c := dialRaw(t, addr)
	c.write(bytes.Repeat([]byte{0x42}, HeaderSize))
	// The receiver counts and logs before it closes the connection.
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [HeaderSize]byte
	var ne net.Error
	if n, err := io.ReadFull(c.c, b[:]); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("after a bad header the connection answered %d bytes (%v), want it closed", n, err)
	}
	if n := rcv.Refused(RefusedBadFrame); n != 1 {
		t.Fatalf("bad_frame refusals %d, want 1", n)
	}
	refusalLine(t, logs, zapcore.WarnLevel, RefusedBadFrame)
}

// sendOnce sends pages (source and destination positions alike) and aux as the one and
// last piece of k from a fresh region of layout l to the receiver at addr, and returns the
// stream's outcome.
func sendOnce(t testing.TB, l Layout, addr string, cfg SenderConfig, k Key, pages [][]Run, aux []byte) error {
	t.Helper()
	snd, err := NewSender(openTestRegion(t, l), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	if err := snd.AddPeer(addr, l); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := snd.Send(ctx, SendRequest{Peer: addr, Key: k, Src: pages, Dst: pages, Aux: aux,
		Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	return waitDone(t, done)
}

// Every refusal has a name: the reason label of pdlink_data_refused_total. (Its log lines
// are rate limited per reason by pkg/loglimit.)
func TestEveryRefusalHasAName(t *testing.T) {
	for _, r := range AllRefusals() {
		if strings.HasPrefix(r.String(), "refusal(") {
			t.Errorf("refusal %d has no name", r)
		}
	}
}
