package transfer

import (
	"bytes"
	"hash/crc32"
	"testing"
)

// The tests in this file pin I8 on the decode side: Complete (Success) only after every
// destination page and the aux row were written once and verified. Each has a twin room
// that does reach Complete through the same frames, so a refusal is the check's doing and
// not a harness that can only fail.

// doneFrameWithCRC is a DONE whose header claims crc for the aux row it carries.
func doneFrameWithCRC(k Key, chunks, pages uint32, aux []byte, crc uint32) []byte {
	b := make([]byte, HeaderSize, HeaderSize+len(aux))
	h := Header{Type: FrameDone, Flags: FlagPayloadCRC, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, From: k.From, Seq: chunks, Pages: pages,
		PayloadLen: uint64(len(aux)), PayloadCRC: crc}
	h.Encode(b)
	return append(b, aux...)
}

// TestDoneWithWrongAuxChecksumFailsRoom_I8: every page of the room landed and verified, but
// the aux row in its DONE does not match the DONE's crc32c. The room fails with "checksum"
// and the sender is told so; it is never Complete.
func TestDoneWithWrongAuxChecksumFailsRoom_I8(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 8, item, 2, 16)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{})
	good, bad := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
	for i, k := range []Key{good, bad} {
		if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{int32(i), 1}}}, AuxRow: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	c := dialRaw(t, addr)
	page := bytes.Repeat([]byte{7}, item)
	aux := bytes.Repeat([]byte{9}, 16)
	for i, k := range []Key{good, bad} {
		c.write(chunkHeader(k, 0, 0, []Run{{int32(i), 1}}, item, page))
		c.write(page)
	}
	c.write(doneFrame(good, 1, 1, aux))
	corrupted := bytes.Clone(aux)
	corrupted[3] ^= 0x01 // the row that arrives is not the row the sender checksummed
	c.write(doneFrameWithCRC(bad, 1, 1, corrupted, crc32.Checksum(aux, castagnoli)))
	res := c.sync()

	if r, ok := ev.get(good); !ok || r != "" || res[good] != uint32(codeOK) {
		t.Fatalf("twin room: outcome %q (reported %v), result %d; want complete", r, ok, res[good])
	}
	if !bytes.Equal(dst.AuxRow(0), aux) {
		t.Fatal("twin room: aux row not in place")
	}
	if r, _ := ev.get(bad); r != ReasonChecksum || res[bad] != uint32(codeChecksum) {
		t.Fatalf("room with a bad aux row: outcome %q, result %d; want checksum", r, res[bad])
	}
}

// TestPageNamedTwiceNeverSucceeds_I8: a room expects pages 0 and 1. Its chunks name page 0
// twice and never page 1, with totals (chunks, pages) that add up, so a receiver that only
// counted pages would report Success with page 1 never written. Decode tracks which
// destination pages were claimed: the repeat fails the room as invalid, page 1 keeps its old
// bytes, and the room is never Complete. The same repeat inside one chunk's run list is
// refused too.
func TestPageNamedTwiceNeverSucceeds_I8(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 16, item, 4, 16)
	page := func(v byte) []byte { return bytes.Repeat([]byte{v}, item) }
	cases := []struct {
		name   string
		chunks [][]Run // one chunk per entry, in seq order
		want   Reason
	}{
		{"twin_every_page_once", [][]Run{{{0, 1}}, {{1, 1}}}, ""},
		{"across_chunks", [][]Run{{{0, 1}}, {{0, 1}}}, ReasonInvalid},
		{"within_one_chunk", [][]Run{{{0, 1}, {0, 1}}}, ReasonInvalid},
	}
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{})
	memset(dst.Buffer(0), 0xAA)
	c := dialRaw(t, addr)
	for i, tc := range cases {
		k := Key{Room: uint64(i + 1), Nonce: 3}
		base := int32(4 * i) // each case owns pages base, base+1
		if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{base, 2}}}, AuxRow: int64(i)}); err != nil {
			t.Fatal(err)
		}
		for seq, runs := range tc.chunks {
			shifted := make([]Run, len(runs))
			var payload []byte
			for j, r := range runs {
				shifted[j] = Run{Start: r.Start + base, Count: r.Count}
				payload = append(payload, page(byte(0x10+seq+j))...)
			}
			c.write(chunkHeader(k, uint32(seq), 0, shifted, item, payload))
			c.write(payload)
		}
		c.write(doneFrame(k, uint32(len(tc.chunks)), 2, make([]byte, 16)))
	}
	res := c.sync()
	for i, tc := range cases {
		k := Key{Room: uint64(i + 1), Nonce: 3}
		r, ok := ev.get(k)
		wantCode := uint32(codeOK)
		if tc.want != "" {
			wantCode = uint32(tc.want.code())
		}
		if !ok || r != tc.want || res[k] != wantCode {
			t.Errorf("%s: outcome %q (reported %v), result %d; want %q", tc.name, r, ok, res[k], tc.want)
		}
		if tc.want != "" && !bytes.Equal(dst.Pages(0, Run{int32(4*i) + 1, 1}), page(0xAA)) {
			t.Errorf("%s: page 1 was written although no chunk named it", tc.name)
		}
	}
}

// TestDoneOnOtherConnectionWhileChunkLandsFailsRoom_I8: the room's only chunk (three pages)
// is partly written on connection A (its first page landed, the rest is still on the wire)
// when a DONE with the room's full totals arrives on connection B. The totals add up, but the pages are not all
// written and verified, so decode must not report Success: it refuses the DONE and fails the
// room as invalid (a Sender sends a room on one connection, so this DONE is a protocol
// fault), and the chunk's pieces after the one in progress are discarded. A twin room whose chunk was fully verified
// on A before its DONE arrived on B completes.
func TestDoneOnOtherConnectionWhileChunkLandsFailsRoom_I8(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 8, item, 2, 16)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{PieceBytes: item})
	memset(dst.Buffer(0), 0xAA)
	landing, twin := Key{Room: 1, Nonce: 5}, Key{Room: 2, Nonce: 5}
	if err := rcv.Expect(Expectation{Key: landing, Dst: [][]Run{{{0, 3}}}, AuxRow: 0}); err != nil {
		t.Fatal(err)
	}
	if err := rcv.Expect(Expectation{Key: twin, Dst: [][]Run{{{4, 2}}}, AuxRow: 1}); err != nil {
		t.Fatal(err)
	}
	a, b := dialRaw(t, addr), dialRaw(t, addr)
	aux := bytes.Repeat([]byte{3}, 16)

	twinPayload := bytes.Repeat([]byte{0x22}, 2*item)
	a.write(chunkHeader(twin, 0, 0, []Run{{4, 2}}, item, twinPayload))
	a.write(twinPayload)
	a.sync() // the twin's chunk is written and verified
	b.write(doneFrame(twin, 1, 2, aux))

	payload := bytes.Repeat([]byte{0x11}, 3*item)
	a.write(chunkHeader(landing, 0, 0, []Run{{0, 3}}, item, payload))
	a.write(payload[:item]) // page 0 lands; A's goroutine now waits inside page 1
	waitFor(t, func() bool { return bytes.Equal(dst.Pages(0, Run{0, 1}), payload[:item]) })
	b.write(doneFrame(landing, 1, 3, aux))
	resB := b.sync()
	if r, ok := ev.get(landing); ok && r == "" {
		t.Fatal("Success reported while a page of the room was still on the wire")
	}
	a.write(payload[item:])
	a.sync()

	if r, ok := ev.get(twin); !ok || r != "" || resB[twin] != uint32(codeOK) {
		t.Fatalf("twin room: outcome %q (reported %v), result %d; want complete", r, ok, resB[twin])
	}
	if r, _ := ev.get(landing); r != ReasonInvalid || resB[landing] != uint32(codeInvalid) {
		t.Fatalf("landing room: outcome %q, DONE answered %d; want invalid", r, resB[landing])
	}
	// Page 1 was the piece in progress when the room failed and may land (the driver's
	// Fence waits for it before anyone reuses the pages); page 2 must not.
	if !bytes.Equal(dst.Pages(0, Run{2, 1}), bytes.Repeat([]byte{0xAA}, item)) {
		t.Fatal("a piece begun after the room failed landed in its pages")
	}
}

// TestSecondDoneWhileAuxRowLandsFailsRoom_I8: every page of the room is verified and its
// DONE's aux row is half written on connection A when a second DONE for the room arrives on
// connection B. Accepting it would report Success while A still writes the aux row; decode
// refuses it and fails the room as invalid.
func TestSecondDoneWhileAuxRowLandsFailsRoom_I8(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 8, item, 1, 16)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{})
	k := Key{Room: 1, Nonce: 6}
	if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{0, 1}}}, AuxRow: 0}); err != nil {
		t.Fatal(err)
	}
	a, b := dialRaw(t, addr), dialRaw(t, addr)
	page := bytes.Repeat([]byte{0x33}, item)
	a.write(chunkHeader(k, 0, 0, []Run{{0, 1}}, item, page))
	a.write(page)
	a.sync()

	aux := bytes.Repeat([]byte{0x44}, 16)
	done := doneFrame(k, 1, 1, aux)
	a.write(done[:HeaderSize+8]) // half the aux row; A's goroutine waits for the rest
	waitFor(t, func() bool { return bytes.Equal(dst.AuxRow(0)[:8], aux[:8]) })
	b.write(doneFrame(k, 1, 1, bytes.Repeat([]byte{0x55}, 16)))
	resB := b.sync()
	if r, ok := ev.get(k); ok && r == "" {
		t.Fatal("Success reported while the aux row was still being written")
	}
	a.write(done[HeaderSize+8:])
	resA := a.sync()
	if r, _ := ev.get(k); r != ReasonInvalid || resB[k] != uint32(codeInvalid) {
		t.Fatalf("outcome %q, second DONE answered %d; want invalid", r, resB[k])
	}
	if resA[k] == uint32(codeOK) {
		t.Fatal("the first DONE was answered ok for a failed room")
	}
}
