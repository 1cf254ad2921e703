package transfer

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestFenceMidChunkNoByteLandsAfter_R7: a room is fenced (aborted) while its chunk is on the
// wire and half written. Fence waits for the piece being written, then not one more byte
// lands in the room's pages, although the rest of the chunk, a further chunk and the DONE
// still arrive. The pages were filled with a sentinel to see any stray write.
func TestFenceMidChunkNoByteLandsAfter_R7(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 32, item, 2, 16)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{PieceBytes: item})
	memset(dst.Buffer(0), 0xAA)
	k := Key{Room: 1, Nonce: 2}
	if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{0, 16}}}, AuxRow: 0}); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, addr)
	payload := bytes.Repeat([]byte{0x11}, 8*item)
	c.write(chunkHeader(k, 0, 0, []Run{{0, 8}}, item, payload))
	c.write(payload[:item]) // page 0 lands; the receiver now waits inside page 1
	waitFor(t, func() bool { return bytes.Equal(dst.Pages(0, Run{0, 1}), payload[:item]) })

	fenced := make(chan struct{})
	go func() { rcv.FenceWait(k); close(fenced) }()
	select {
	case <-fenced:
		t.Fatal("Fence returned while a write into the room's pages was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	c.write(payload[item : 2*item]) // completes the piece in progress
	select {
	case <-fenced:
	case <-time.After(5 * time.Second):
		t.Fatal("Fence did not return after the in-progress piece finished")
	}
	after := bytes.Clone(dst.Buffer(0))

	c.write(payload[2*item:]) // the rest of the chunk is still on the wire
	more := bytes.Repeat([]byte{0x22}, 8*item)
	c.write(chunkHeader(k, 1, 0, []Run{{8, 8}}, item, more))
	c.write(more)
	c.write(doneFrame(k, 2, 16, make([]byte, 16)))
	res := c.sync()

	if !bytes.Equal(after, dst.Buffer(0)) {
		t.Fatal("bytes landed in the room's pages after Fence returned")
	}
	if !bytes.Equal(dst.Pages(0, Run{2, 14}), bytes.Repeat([]byte{0xAA}, 14*item)) {
		t.Fatal("pages after the fence point are not the sentinel")
	}
	if st := res[k]; st != uint32(codeFenced) {
		t.Fatalf("DONE for a fenced room answered %d, want fenced", st)
	}
	if s := rcv.Stats(); s.DiscardedChunks < 2 {
		t.Fatalf("stats %+v: want the rest of the chunk and the next chunk discarded", s)
	}
	if _, ok := ev.get(k); ok {
		t.Fatal("a fenced room must not report an outcome")
	}
}

// TestFenceWhileSenderStreamsNoByteLandsAfter_R7 aborts a room from inside its first Progress
// event while the real Sender keeps streaming its chunks; no later byte lands and the sender
// learns the room was refused.
func TestFenceWhileSenderStreamsNoByteLandsAfter_R7(t *testing.T) {
	const item = 4096
	l := UniformLayout(2, 256, item, 1, 8)
	for _, tcp := range []bool{false, true} {
		t.Run(map[bool]string{false: "mem", true: "tcp"}[tcp], func(t *testing.T) {
			g := newRig(t, l, l, tcp, SenderConfig{MaxChunkBytes: 4 * item}, ReceiverConfig{PieceBytes: item})
			k := Key{Room: 9, Nonce: 9}
			fill(g.src.Buffer(0), 1)
			fill(g.src.Buffer(1), 2)
			memset(g.dst.Buffer(0), 0xAA)
			memset(g.dst.Buffer(1), 0xAA)
			var mu sync.Mutex // guards after, written on the receiver's connection goroutine
			var after []byte
			fenceOnce := make(chan struct{})
			g.ev2(func(key Key) {
				select {
				case <-fenceOnce:
					return
				default:
				}
				close(fenceOnce)
				g.rcv.FenceWait(key)
				mu.Lock()
				after = snapshot(g.dst)
				mu.Unlock()
			})
			all := SamePages(2, []Run{{0, 256}})
			if err := g.rcv.Expect(Expectation{Key: k, Dst: all, AuxRow: 0}); err != nil {
				t.Fatal(err)
			}
			err := waitDone(t, g.send(t, k, all, all, make([]byte, 8)))
			if !errors.Is(err, ErrRejected) || ReasonOf(err) != ReasonFenced {
				t.Fatalf("sender outcome %v, want fenced", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if after == nil {
				t.Fatal("no progress event")
			}
			if !bytes.Equal(after, snapshot(g.dst)) {
				t.Fatal("bytes landed in the room's pages after Fence returned")
			}
			if bytes.Equal(g.dst.Pages(1, Run{255, 1}), g.src.Pages(1, Run{255, 1})) {
				t.Fatal("the last page arrived: the fence did not stop the room")
			}
		})
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	until(t, 5*time.Second, "condition", cond)
}

// TestDoneBeforeEveryPageFailsRoom_I8: a DONE that arrives before every page of every buffer
// landed, or without the aux row, fails the room as invalid; it is never Complete.
func TestDoneBeforeEveryPageFailsRoom_I8(t *testing.T) {
	const item = 4096
	l := UniformLayout(2, 8, item, 2, 16)
	rcv, _, ev, addr := rawReceiver(t, l, ReceiverConfig{})
	c := dialRaw(t, addr)
	page := bytes.Repeat([]byte{1}, item)
	missingBuffer, missingAux := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
	for _, k := range []Key{missingBuffer, missingAux} {
		if err := rcv.Expect(Expectation{Key: k, Dst: SamePages(2, []Run{{int32(k.Room), 1}}), AuxRow: 0}); err != nil {
			t.Fatal(err)
		}
	}
	// Only buffer 0 of the first room, but a DONE that claims the room's totals.
	c.write(chunkHeader(missingBuffer, 0, 0, []Run{{1, 1}}, item, page))
	c.write(page)
	c.write(doneFrame(missingBuffer, 1, 2, make([]byte, 16)))
	// Every page of the second room, but no aux row.
	for b := uint32(0); b < 2; b++ {
		c.write(chunkHeader(missingAux, b, b, []Run{{2, 1}}, item, page))
		c.write(page)
	}
	c.write(doneFrame(missingAux, 2, 2, nil))
	res := c.sync()
	for _, k := range []Key{missingBuffer, missingAux} {
		if r, _ := ev.get(k); r != ReasonInvalid || res[k] != uint32(codeInvalid) {
			t.Fatalf("room %v: outcome %q, result %d; want invalid", k, r, res[k])
		}
	}
}
