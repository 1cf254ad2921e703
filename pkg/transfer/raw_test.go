package transfer

import (
	"hash/crc32"
	"io"
	"net"
	"testing"
	"time"
)

// rawClient speaks the wire format by hand, to put exactly chosen bytes on the wire.
type rawClient struct {
	t testing.TB
	c net.Conn
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, c: c}
}

func (r *rawClient) write(b []byte) {
	r.t.Helper()
	r.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

// chunkHeader returns the header and run list of a chunk of buffer buf whose payload is
// payload (the crc is computed over payload; the caller may send other bytes).
func chunkHeader(k Key, seq uint32, buf uint32, runs []Run, itemLen int, payload []byte) []byte {
	crs := make([]ChunkRun, len(runs))
	for i, r := range runs {
		crs[i] = ChunkRun{Buffer: buf, Run: r}
	}
	return chunkHeaderRuns(k, seq, crs, itemLen, payload)
}

// chunkHeaderRuns is chunkHeader for a run list that may name several buffers (all of
// itemLen bytes per page).
func chunkHeaderRuns(k Key, seq uint32, runs []ChunkRun, itemLen int, payload []byte) []byte {
	meta := AppendRuns(make([]byte, HeaderSize), runs)
	var pages int64
	for _, r := range runs {
		pages += int64(r.Count)
	}
	h := Header{Type: FrameChunk, Flags: FlagPayloadCRC, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, From: k.From, Seq: seq,
		NumRuns: uint32(len(runs)), Pages: uint32(pages), PayloadLen: uint64(pages) * uint64(itemLen),
		PayloadCRC: crc32.Checksum(payload, castagnoli), RunsCRC: RunsChecksum(meta[HeaderSize:])}
	h.Encode(meta)
	return meta
}

func doneFrame(k Key, chunks, pages uint32, aux []byte) []byte {
	b := make([]byte, HeaderSize, HeaderSize+len(aux))
	h := Header{Type: FrameDone, Flags: FlagPayloadCRC, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, From: k.From, Seq: chunks, Pages: pages,
		PayloadLen: uint64(len(aux)), PayloadCRC: crc32.Checksum(aux, castagnoli)}
	h.Encode(b)
	return append(b, aux...)
}

// sync sends a ping and reads frames until the pong, so everything sent before it has been
// processed by the receiver. It returns the results read on the way.
func (r *rawClient) sync() map[Key]uint32 {
	r.t.Helper()
	var b [HeaderSize]byte
	(&Header{Type: FramePing}).Encode(b[:])
	r.write(b[:])
	res := map[Key]uint32{}
	for {
		r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(r.c, b[:]); err != nil {
			r.t.Fatalf("sync: %v", err)
		}
		h, err := DecodeHeader(b[:])
		if err != nil {
			r.t.Fatalf("sync: %v", err)
		}
		if h.Type == FramePong {
			return res
		}
		res[h.Key()] = h.Status
	}
}

// rawReceiver is a Receiver on loopback TCP for hand-written frames.
func rawReceiver(t testing.TB, l Layout, rc ReceiverConfig) (*Receiver, *Region, *events, string) {
	t.Helper()
	dst := openTestRegion(t, l)
	ev := newEvents()
	rcv, err := NewReceiver(dst, rc, ev)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); rcv.Serve(ln) }()
	t.Cleanup(func() { rcv.Close(); <-served })
	return rcv, dst, ev, ln.Addr().String()
}
