package transfer

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// wireSentinels are the errors a decoder may return (wrapped).
var wireSentinels = []error{ErrShortFrame, ErrBadMagic, ErrBadVersion, ErrHeaderChecksum, ErrBadFrameType,
	ErrFrameTooLarge, ErrRunsChecksum, ErrEmptyRun}

func isWireSentinel(err error) bool {
	for _, s := range wireSentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// seedFrames are valid frames of every type, the seeds of the fuzz targets.
func seedFrames() [][]byte {
	k := Key{Room: 42, Nonce: 7}
	var out [][]byte
	for _, h := range []Header{
		{Type: FramePing}, {Type: FramePong},
		{Type: FrameResult, Room: 1, Nonce: 2, Status: uint32(codeChecksum)},
		{Type: FrameDone, Flags: FlagPayloadCRC, Room: k.Room, Nonce: k.Nonce, Seq: 1, Pages: 4, PayloadLen: 16},
	} {
		b := make([]byte, HeaderSize)
		h.Encode(b)
		out = append(out, b)
	}
	payload := bytes.Repeat([]byte{9}, 2*512)
	out = append(out, append(chunkHeader(k, 0, 0, []Run{{1, 2}}, 512, payload), payload...))
	return out
}

func FuzzDecodeHeader(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			if !isWireSentinel(err) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		var again [HeaderSize]byte
		h.Encode(again[:])
		if !bytes.Equal(again[:], b[:HeaderSize]) {
			t.Fatalf("decode/encode round trip differs")
		}
	})
}

func FuzzDecodeRuns(f *testing.F) {
	runs := AppendRuns(nil, []Run{{0, 1}, {5, 3}})
	f.Add(runs, uint32(2), RunsChecksum(runs))
	f.Add([]byte{}, uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, n uint32, crc uint32) {
		got, err := DecodeRuns(nil, b, n, crc)
		if err != nil {
			if !isWireSentinel(err) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		if uint32(len(got)) != n || !bytes.Equal(AppendRuns(nil, got), b) {
			t.Fatalf("round trip differs")
		}
	})
}

// FuzzReceiverStream feeds arbitrary bytes to a live receiver connection: it never panics,
// and no byte lands outside the one registered room's pages.
func FuzzReceiverStream(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	const item = 512
	l := UniformLayout(1, 8, item, 1, 16)
	dst := openTestRegion(f, l)
	rcv, err := NewReceiver(dst, ReceiverConfig{IdleTimeout: time.Second}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { rcv.Close() })
	k := Key{Room: 42, Nonce: 7}
	f.Fuzz(func(t *testing.T, b []byte) {
		memset(dst.Buffer(0), 0xAA)
		rcv.Fence(k)
		if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{1, 2}}}, AuxRow: 0}); err != nil {
			t.Fatal(err)
		}
		client, server := net.Pipe()
		rcv.ServeConn(server)
		go func() { // answers (results, pongs) are read and dropped
			buf := make([]byte, 256)
			for {
				if _, err := client.Read(buf); err != nil {
					return
				}
			}
		}()
		client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		client.Write(b)
		client.Close()
		waitFor(t, func() bool { rcv.mu.Lock(); defer rcv.mu.Unlock(); return len(rcv.conns) == 0 })
		outside := append(bytes.Clone(dst.Pages(0, Run{0, 1})), dst.Pages(0, Run{3, 5})...)
		if !bytes.Equal(outside, bytes.Repeat([]byte{0xAA}, len(outside))) {
			t.Fatal("bytes landed outside the room's pages")
		}
	})
}

// TestWriteFuzzSeedCorpus regenerates testdata/fuzz from seedFrames when
// PDLINK_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeedCorpus(t *testing.T) {
	if os.Getenv("PDLINK_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set PDLINK_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz")
	}
	for _, target := range []string{"FuzzDecodeHeader", "FuzzReceiverStream"} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seedFrames() {
			body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeRuns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	runs := AppendRuns(nil, []Run{{0, 1}, {5, 3}})
	body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\nuint32(2)\nuint32(%d)\n", strconv.Quote(string(runs)), RunsChecksum(runs))
	if err := os.WriteFile(filepath.Join(dir, "seed-0"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
