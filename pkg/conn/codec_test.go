package conn

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
)

func hdr(seq uint64) *pdlinkv1.Envelope {
	return &pdlinkv1.Envelope{ProtocolVersion: ProtocolVersion, SenderInstance: "d1", Epoch: 1, Seq: seq}
}

func with(e *pdlinkv1.Envelope, f func(*pdlinkv1.Envelope)) *pdlinkv1.Envelope { f(e); return e }

func goodMetadata() *pdlinkv1.Metadata {
	return &pdlinkv1.Metadata{RoomId: 1, Nonce: 2, Rank: &pdlinkv1.Rank{TpSize: 1}, DstPages: &pdlinkv1.PageList{Indices: []int32{3, 1, 2}}, ExpectedSenders: 1}
}

// validFrames is one valid envelope per body type (also the fuzz seeds).
func validFrames() map[string]*pdlinkv1.Envelope {
	return map[string]*pdlinkv1.Envelope{
		"register": with(hdr(1), func(e *pdlinkv1.Envelope) {
			e.Body = &pdlinkv1.Envelope_Register{Register: &pdlinkv1.Register{InstanceId: "d1", DataEndpoint: "10.0.0.2:7000",
				Layouts: []*pdlinkv1.RegionLayout{{Rank: &pdlinkv1.Rank{TpSize: 2, TpRank: 1}, Buffers: []*pdlinkv1.BufferSpec{{Offset: 0, Length: 4096, ItemLen: 64}}, Aux: &pdlinkv1.AuxSpec{RowLen: 16, Rows: 8}}}}}
		}),
		"metadata": with(hdr(2), func(e *pdlinkv1.Envelope) { e.Body = &pdlinkv1.Envelope_Metadata{Metadata: goodMetadata()} }),
		"metadata_runs": with(hdr(3), func(e *pdlinkv1.Envelope) {
			m := goodMetadata()
			m.DstPages = &pdlinkv1.PageList{Runs: []*pdlinkv1.PageRun{{Start: 10, Count: 5}, {Start: 0, Count: 10}}}
			e.Body = &pdlinkv1.Envelope_Metadata{Metadata: m}
		}),
		"metadata_prefix": with(hdr(3), func(e *pdlinkv1.Envelope) {
			m := goodMetadata()
			m.DstPages = &pdlinkv1.PageList{Runs: []*pdlinkv1.PageRun{{Start: 10, Count: 5}, {Start: 0, Count: 10}}}
			m.PrefixLen = 15 // decode holds every position
			e.Body = &pdlinkv1.Envelope_Metadata{Metadata: m}
		}),
		"abort": with(hdr(4), func(e *pdlinkv1.Envelope) {
			e.Body = &pdlinkv1.Envelope_Abort{Abort: &pdlinkv1.Abort{RoomId: 1, Nonce: 2, Reason: "timeout:bootstrapping"}}
		}),
		"abort_ack": with(hdr(5), func(e *pdlinkv1.Envelope) {
			e.Body = &pdlinkv1.Envelope_AbortAck{AbortAck: &pdlinkv1.AbortAck{RoomId: 1, Nonce: 2}}
		}),
		"status": with(hdr(6), func(e *pdlinkv1.Envelope) {
			e.Body = &pdlinkv1.Envelope_Status{Status: &pdlinkv1.Status{RoomId: 1, Nonce: 2, State: pdlinkv1.RoomState_ROOM_STATE_FAILED, Reason: "checksum"}}
		}),
		"heartbeat": with(hdr(0), func(e *pdlinkv1.Envelope) {
			e.Body = &pdlinkv1.Envelope_Heartbeat{Heartbeat: &pdlinkv1.Heartbeat{LiveRooms: 3}}
		}),
		"ack": with(hdr(0), func(e *pdlinkv1.Envelope) {
			e.Body = &pdlinkv1.Envelope_Ack{Ack: &pdlinkv1.Ack{AckedSeq: 9, Result: pdlinkv1.AckResult_ACK_RESULT_ENDED, Reason: "peer_lost"}}
		}),
		"goodbye": with(hdr(7), func(e *pdlinkv1.Envelope) { e.Body = &pdlinkv1.Envelope_Goodbye{Goodbye: &pdlinkv1.Goodbye{}} }),
	}
}

func TestCodecRoundTripsEveryFrameType(t *testing.T) {
	c := &Codec{}
	covered := map[FrameType]bool{}
	for name, env := range validFrames() {
		ft, _ := FrameTypeOf(env)
		covered[ft] = true
		b, err := c.Encode(env)
		if err != nil {
			t.Fatalf("%s: encode: %v", name, err)
		}
		got, err := c.Decode(b)
		if err != nil {
			t.Fatalf("%s: decode: %v", name, err)
		}
		if !proto.Equal(got, env) {
			t.Fatalf("%s: round trip changed the envelope", name)
		}
		t.Logf("%-14s %4d bytes", name, len(b))
	}
	for _, ft := range AllFrameTypes() {
		if !covered[ft] || ft.String() == "unknown" {
			t.Errorf("frame type %d (%s) has no valid example: add it to validFrames", ft, ft)
		}
	}
}

func TestCodecRejectsInvalidFramesByReason(t *testing.T) {
	md := func(f func(m *pdlinkv1.Metadata)) *pdlinkv1.Envelope {
		m := goodMetadata()
		f(m)
		return with(hdr(1), func(e *pdlinkv1.Envelope) { e.Body = &pdlinkv1.Envelope_Metadata{Metadata: m} })
	}
	cases := []struct {
		name string
		env  *pdlinkv1.Envelope
		want RejectReason
	}{
		{"version", with(validFrames()["abort"], func(e *pdlinkv1.Envelope) { e.ProtocolVersion = 2 }), RejectVersion},
		{"no sender", with(validFrames()["abort"], func(e *pdlinkv1.Envelope) { e.SenderInstance = "" }), RejectInvalid},
		{"epoch 0", with(validFrames()["abort"], func(e *pdlinkv1.Envelope) { e.Epoch = 0 }), RejectInvalid},
		{"no body", hdr(1), RejectInvalid},
		{"reliable without seq", with(validFrames()["abort"], func(e *pdlinkv1.Envelope) { e.Seq = 0 }), RejectInvalid},
		{"goodbye without seq", with(validFrames()["goodbye"], func(e *pdlinkv1.Envelope) { e.Seq = 0 }), RejectInvalid},
		{"heartbeat with seq", with(validFrames()["heartbeat"], func(e *pdlinkv1.Envelope) { e.Seq = 3 }), RejectInvalid},
		{"room 0", md(func(m *pdlinkv1.Metadata) { m.RoomId = 0 }), RejectInvalid},
		{"room over 63 bits", md(func(m *pdlinkv1.Metadata) { m.RoomId = 1 << 63 }), RejectInvalid},
		{"nonce 0", md(func(m *pdlinkv1.Metadata) { m.Nonce = 0 }), RejectInvalid},
		{"no senders", md(func(m *pdlinkv1.Metadata) { m.ExpectedSenders = 0 }), RejectInvalid},
		{"bad rank", md(func(m *pdlinkv1.Metadata) { m.Rank = &pdlinkv1.Rank{TpRank: 2, TpSize: 2} }), RejectInvalid},
		{"no pages", md(func(m *pdlinkv1.Metadata) { m.DstPages = nil }), RejectInvalid},
		{"both lists", md(func(m *pdlinkv1.Metadata) { m.DstPages.Runs = []*pdlinkv1.PageRun{{Count: 1}} }), RejectInvalid},
		{"negative page", md(func(m *pdlinkv1.Metadata) { m.DstPages.Indices = []int32{-1} }), RejectInvalid},
		{"page twice", md(func(m *pdlinkv1.Metadata) { m.DstPages.Indices = []int32{4, 5, 4} }), RejectInvalid},
		{"prefix over the pages", md(func(m *pdlinkv1.Metadata) { m.PrefixLen = 4 }), RejectInvalid},
		{"runs overlap", md(func(m *pdlinkv1.Metadata) {
			m.DstPages = &pdlinkv1.PageList{Runs: []*pdlinkv1.PageRun{{Start: 0, Count: 5}, {Start: 4, Count: 1}}}
		}), RejectInvalid},
		{"run overflows", md(func(m *pdlinkv1.Metadata) {
			m.DstPages = &pdlinkv1.PageList{Runs: []*pdlinkv1.PageRun{{Start: 1<<31 - 2, Count: 5}}}
		}), RejectInvalid},
		{"too many pages", md(func(m *pdlinkv1.Metadata) {
			m.DstPages = &pdlinkv1.PageList{Runs: []*pdlinkv1.PageRun{{Start: 0, Count: 1 << 30}}}
		}), RejectTooLarge},
		{"unknown reason", with(validFrames()["abort"], func(e *pdlinkv1.Envelope) { e.GetAbort().Reason = "because" }), RejectInvalid},
		{"uncleared is no failure", with(validFrames()["abort"], func(e *pdlinkv1.Envelope) { e.GetAbort().Reason = "uncleared" }), RejectInvalid},
		{"status failed without reason", with(validFrames()["status"], func(e *pdlinkv1.Envelope) { e.GetStatus().Reason = "" }), RejectInvalid},
		{"status bootstrapping", with(validFrames()["status"], func(e *pdlinkv1.Envelope) {
			e.GetStatus().State = pdlinkv1.RoomState_ROOM_STATE_BOOTSTRAPPING
		}), RejectInvalid},
		{"ack of 0", with(validFrames()["ack"], func(e *pdlinkv1.Envelope) { e.GetAck().AckedSeq = 0 }), RejectInvalid},
		{"ack unspecified", with(validFrames()["ack"], func(e *pdlinkv1.Envelope) { e.GetAck().Result = 0 }), RejectInvalid},
		{"register for another", with(validFrames()["register"], func(e *pdlinkv1.Envelope) { e.GetRegister().InstanceId = "d2" }), RejectInvalid},
		{"register bad endpoint", with(validFrames()["register"], func(e *pdlinkv1.Envelope) { e.GetRegister().DataEndpoint = "nohost" }), RejectInvalid},
		{"register port 0", with(validFrames()["register"], func(e *pdlinkv1.Envelope) { e.GetRegister().DataEndpoint = "h:0" }), RejectInvalid},
		{"register bad buffer", with(validFrames()["register"], func(e *pdlinkv1.Envelope) {
			e.GetRegister().Layouts[0].Buffers[0].Length = 100
		}), RejectInvalid},
		{"register unknown attention", with(validFrames()["register"], func(e *pdlinkv1.Envelope) { e.GetRegister().Layouts[0].Attention = 7 }), RejectInvalid},
		{"register bad aux", with(validFrames()["register"], func(e *pdlinkv1.Envelope) { e.GetRegister().Layouts[0].Aux.Rows = 0 }), RejectInvalid},
	}
	c := &Codec{}
	for _, tc := range cases {
		b, err := proto.Marshal(tc.env)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Decode(b)
		got, ok := RejectReasonOf(err)
		if !ok || got != tc.want {
			t.Errorf("%s: err %v (reason %v), want %v", tc.name, err, got, tc.want)
		}
	}
	if _, err := c.Decode([]byte{0x0a, 0xff}); !errors.Is(err, ErrDecode) {
		t.Errorf("garbage: %v", err)
	}
	small := &Codec{Limits: Limits{MaxFrameBytes: 16}}
	if _, err := small.Decode(make([]byte, 17)); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversize: %v", err)
	}
}

// sumAuth is a toy Authenticator: the MAC is a keyed SHA-256.
type sumAuth struct{ key byte }

func (a sumAuth) Seal(b []byte) ([]byte, error) {
	s := sha256.Sum256(append([]byte{a.key}, b...))
	return s[:], nil
}

func (a sumAuth) Verify(b, mac []byte) error {
	want, _ := a.Seal(b)
	if !bytes.Equal(want, mac) {
		return errors.New("bad mac")
	}
	return nil
}

// The MAC hook: sealed frames verify, tampered ones and other keys do not.
func TestCodecAuthenticatorHook(t *testing.T) {
	c := &Codec{Auth: sumAuth{1}}
	b, err := c.Encode(validFrames()["metadata"])
	if err != nil {
		t.Fatal(err)
	}
	env, err := c.Decode(b)
	if err != nil || len(env.GetMac()) != sha256.Size {
		t.Fatalf("sealed frame: %v (mac %d bytes)", err, len(env.GetMac()))
	}
	if _, err := (&Codec{Auth: sumAuth{2}}).Decode(b); !errors.Is(err, ErrAuth) {
		t.Fatalf("other key: %v", err)
	}
	tampered := with(validFrames()["metadata"], func(e *pdlinkv1.Envelope) { e.Seq = 77; e.Mac = env.GetMac() })
	tb, _ := proto.Marshal(tampered)
	if _, err := c.Decode(tb); !errors.Is(err, ErrAuth) {
		t.Fatalf("replayed mac on another seq: %v", err)
	}
}

var writeSeeds = flag.Bool("write-seeds", false, "rewrite testdata/fuzz/FuzzDecodeEnvelope from validFrames")

// TestFuzzSeedCorpus keeps the committed seed corpus in step with
// validFrames (run with -write-seeds to regenerate it).
func TestFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeEnvelope")
	if !*writeSeeds {
		entries, err := os.ReadDir(dir)
		if err != nil || len(entries) < len(validFrames()) {
			t.Fatalf("seed corpus missing (%v): run go test -run TestFuzzSeedCorpus -write-seeds", err)
		}
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Codec{}
	for name, env := range validFrames() {
		b, err := c.Encode(env)
		if err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, "seed-"+name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
