package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

const (
	tpPages   = 12 // pages per buffer on every rank
	tpAuxRows = 2
	tpAuxRow  = 24
)

// tpShape is one model's KV shape served by a prefill and a decode engine of given TP sizes.
type tpShape struct {
	prefillTP, decodeTP          int
	heads, headBytes, pageTokens int
	buffers                      int
}

func (sh tpShape) String() string {
	return fmt.Sprintf("prefill %d -> decode %d, %d heads of %d bytes, %d tokens, %d buffers",
		sh.prefillTP, sh.decodeTP, sh.heads, sh.headBytes, sh.pageTokens, sh.buffers)
}

// layout is rank's described layout on a side of TP size tp.
func (sh tpShape) layout(tp, rank int) Layout {
	rankHeads := max(sh.heads/tp, 1)
	l := UniformLayout(sh.buffers, tpPages, int64(sh.pageTokens*rankHeads*sh.headBytes), tpAuxRows, tpAuxRow)
	l.Rank = Rank{TP: uint16(rank), Size: uint16(tp)}
	return l.WithHeads(rankmap.MHA, int64(sh.pageTokens), int64(sh.heads), int64(sh.headBytes))
}

// globalHead is the model head that local head h of rank r of a TP-tp side holds
// (SGLang's layout: consecutive ranks share a head when heads < tp). The test's oracle,
// written apart from rankmap.
func globalHead(heads, tp, r, h int) int {
	if heads >= tp {
		return r*(heads/tp) + h
	}
	return r / (tp / heads)
}

// headByte is byte k of model head g of token t of source page p of buffer b: what every
// prefill rank holding g has there (replicas hold the same bytes, as in an engine). Never
// the 0xAA of untouched destination memory.
func headByte(seed uint64, b, p, t, g, k int) byte {
	x := seed ^ uint64(b)<<48 ^ uint64(p)<<36 ^ uint64(t)<<24 ^ uint64(g)<<12 ^ uint64(k)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 29
	if v := byte(x); v != 0xAA {
		return v
	}
	return 0x55
}

// tpRig is a prefill engine and a decode engine of TP ranks: per prefill rank a source
// region and a Sender, per decode rank a destination region and a Receiver, over a
// MemNetwork or loopback TCP. sc.Transport is both sides' (auto or shm: decode copies
// the pages from the prefill files, which then stay on disk until close).
type tpRig struct {
	sh   tpShape
	m    rankmap.Mapping
	src  []*Region
	dst  []*Region
	snd  []*Sender
	rcv  []*Receiver
	ev   []*events
	addr []string
	stop []func()
}

func newTPRig(t interface{ Fatalf(string, ...any) }, sh tpShape, tcp bool, sc SenderConfig) *tpRig {
	g := &tpRig{sh: sh}
	ok := false
	defer func() {
		if !ok {
			g.close()
		}
	}()
	var err error
	if g.m, err = PlanRanks(sh.layout(sh.prefillTP, 0), sh.layout(sh.decodeTP, 0)); err != nil {
		t.Fatalf("%v: %v", sh, err)
	}
	shm := sc.Transport == KindAuto || sc.Transport == KindShm
	open := func(l Layout) *Region {
		dir := "/dev/shm"
		if _, err := os.Stat(dir); err != nil {
			dir = os.TempDir()
		}
		path, err := CreateRegionFile(dir, l)
		if err != nil {
			t.Fatalf("%v", err)
		}
		r, err := OpenRegion(path, l)
		if !shm {
			os.Remove(path) // the mapping stays
		}
		if err != nil {
			os.Remove(path)
			t.Fatalf("%v", err)
		}
		g.stop = append(g.stop, func() { r.Close(); os.Remove(path) })
		return r
	}
	var mem *MemNetwork
	if !tcp {
		mem = NewMemNetwork()
		sc.Dialer = mem
	}
	for d := range sh.decodeTP {
		r := open(sh.layout(sh.decodeTP, d))
		ev := newEvents()
		rcv, err := NewReceiver(r, ReceiverConfig{PieceBytes: 4096, Transport: sc.Transport}, ev)
		if err != nil {
			t.Fatalf("%v", err)
		}
		var ln net.Listener
		if tcp {
			ln, err = net.Listen("tcp", "127.0.0.1:0")
		} else {
			ln, err = mem.Listen(fmt.Sprintf("decode-%d", d))
		}
		if err != nil {
			t.Fatalf("%v", err)
		}
		served := make(chan struct{})
		go func() { defer close(served); rcv.Serve(ln) }()
		g.stop = append(g.stop, func() { rcv.Close(); <-served })
		g.dst, g.rcv, g.ev, g.addr = append(g.dst, r), append(g.rcv, rcv), append(g.ev, ev), append(g.addr, ln.Addr().String())
	}
	for s := range sh.prefillTP {
		r := open(sh.layout(sh.prefillTP, s))
		snd, err := NewSender(r, sc)
		if err != nil {
			t.Fatalf("%v", err)
		}
		g.stop = append(g.stop, func() { snd.Close() })
		for d := range sh.decodeTP {
			if err := snd.AddPeer(g.addr[d], sh.layout(sh.decodeTP, d)); err != nil {
				t.Fatalf("add decode rank %d to prefill rank %d: %v", d, s, err)
			}
		}
		g.src, g.snd = append(g.src, r), append(g.snd, snd)
	}
	ok = true
	return g
}

// close stops Senders first, then Receivers, then unmaps.
func (g *tpRig) close() {
	for i := len(g.stop) - 1; i >= 0; i-- {
		g.stop[i]()
	}
	g.stop = nil
}

// fillSources writes headByte into every byte of every prefill rank's pages.
func (g *tpRig) fillSources(seed uint64) {
	sh := g.sh
	rankHeads := max(sh.heads/sh.prefillTP, 1)
	for s, r := range g.src {
		for b := range sh.buffers {
			buf := r.Buffer(b)
			i := 0
			for p := range tpPages {
				for t := range sh.pageTokens {
					for h := range rankHeads {
						gh := globalHead(sh.heads, sh.prefillTP, s, h)
						for k := range sh.headBytes {
							buf[i] = headByte(seed, b, p, t, gh, k)
							i++
						}
					}
				}
			}
		}
	}
}

// streamKey is the key of the stream from prefill rank s to decode rank d: the receiver
// names d, the nonce tells the sources of one decode rank apart.
func streamKey(room uint64, s, d, decodeTP int) Key {
	return Key{Room: room, Nonce: uint64(s)<<8 | uint64(d) + 1, Rank: Rank{TP: uint16(d), Size: uint16(decodeTP)}}
}

// copiesFor is what the room layer passes both ends: nil (whole pages) when the decode
// rank reads whole pages from one prefill rank (equal TP, or a row that is one replicated
// head: rankmap's DecodeRank.WholePages), else the mapping's copies for the pair.
func (g *tpRig) copiesFor(s, d int) []rankmap.Copy {
	if g.m.DecodeRanks[d].WholePages() {
		return nil
	}
	return g.m.CopiesFrom(s, d)
}

// pageLists draws, per buffer, n distinct pages (the same list object for every buffer,
// SamePages-style, or one per buffer).
func pageLists(t *rapid.T, label string, buffers, n int) [][]int32 {
	all := make([]int32, tpPages)
	for i := range all {
		all[i] = int32(i)
	}
	if rapid.Bool().Draw(t, label+"_same") {
		p := rapid.Permutation(all).Draw(t, label+"_perm")[:n]
		out := make([][]int32, buffers)
		for b := range out {
			out[b] = p
		}
		return out
	}
	out := make([][]int32, buffers)
	for b := range out {
		out[b] = rapid.Permutation(all).Draw(t, fmt.Sprintf("%s_perm%d", label, b))[:n]
	}
	return out
}

func runsOf(lists [][]int32) [][]Run {
	out := make([][]Run, len(lists))
	for b, l := range lists {
		if b > 0 && &l[0] == &lists[b-1][0] {
			out[b] = out[b-1] // one list for every buffer: SamePages
			continue
		}
		out[b] = RunsFromPages(l)
	}
	return out
}

// tpRoom is one room moved between the engines: the pages, the streams sent and the one
// left out (the bytes it would have brought must stay untouched).
type tpRoom struct {
	room     uint64
	src, dst [][]int32
	aux      []byte
	auxRow   int64
	dropS    int // prefill rank whose stream to decode rank dropD is never sent; -1 none
	dropD    int
}

// move expects and sends every stream of the room except the dropped one, waits for every
// sent stream's Done and Complete, then fences every key.
func (g *tpRig) move(t interface {
	Fatalf(string, ...any)
}, rm tpRoom) {
	src, dst := runsOf(rm.src), runsOf(rm.dst)
	type sent struct {
		key  Key
		d    int
		done chan error
	}
	var streams []sent
	var keys []struct {
		d int
		k Key
	}
	for d, dr := range g.m.DecodeRanks {
		for _, s := range dr.From {
			k := streamKey(rm.room, s, d, g.sh.decodeTP)
			auxRow, aux := int64(-1), []byte(nil)
			if s == dr.AuxFrom {
				auxRow, aux = rm.auxRow, rm.aux
			}
			if err := g.rcv[d].Expect(Expectation{Key: k, Dst: dst, AuxRow: auxRow, Copies: g.copiesFor(s, d)}); err != nil {
				t.Fatalf("expect %v: %v", k, err)
			}
			keys = append(keys, struct {
				d int
				k Key
			}{d, k})
			if s == rm.dropS && d == rm.dropD {
				continue
			}
			done := make(chan error, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := g.snd[s].Send(ctx, SendRequest{Peer: g.addr[d], Key: k, Src: src, Dst: dst, Aux: aux,
				Copies: g.copiesFor(s, d), Done: func(err error) { done <- err }})
			cancel()
			if err != nil {
				t.Fatalf("send %v from prefill rank %d: %v", k, s, err)
			}
			streams = append(streams, sent{k, d, done})
		}
	}
	for _, st := range streams {
		select {
		case err := <-st.done:
			if err != nil {
				t.Fatalf("stream %v: %v", st.key, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %v: not done within 10s", st.key)
		}
		if r, ok := g.ev[st.d].get(st.key); !ok || r != "" {
			t.Fatalf("stream %v: receiver outcome %q (reported %v), want complete", st.key, r, ok)
		}
	}
	for _, k := range keys {
		g.rcv[k.d].FenceWait(k.k)
	}
}

// check compares every byte of every decode rank's region with the oracle: destination
// page i of buffer b holds, in each token and head, the bytes of that model head of source
// page i; the heads the dropped stream would have brought, every page that is not a
// destination and the aux row of a rank whose aux stream was dropped hold 0xAA.
func (g *tpRig) check(t interface{ Fatalf(string, ...any) }, rm tpRoom, seed uint64) {
	sh := g.sh
	rankHeads := max(sh.heads/sh.decodeTP, 1)
	for d, r := range g.dst {
		dropped := func(b, h int) bool {
			if d != rm.dropD {
				return false
			}
			for _, c := range g.m.DecodeRanks[d].Copies {
				if c.Buffer == b && h >= c.DstHead && h < c.DstHead+c.Heads {
					return c.From == rm.dropS
				}
			}
			t.Fatalf("decode rank %d buffer %d head %d: no copy brings it", d, b, h)
			return false
		}
		for b := range sh.buffers {
			srcOf := map[int32]int{}
			for i, p := range rm.dst[b] {
				srcOf[p] = int(rm.src[b][i])
			}
			buf := r.Buffer(b)
			i := 0
			for p := range int32(tpPages) {
				sp, isDst := srcOf[p]
				for tok := range sh.pageTokens {
					for h := range rankHeads {
						gh := globalHead(sh.heads, sh.decodeTP, d, h)
						drop := isDst && dropped(b, h)
						for k := range sh.headBytes {
							want := byte(0xAA)
							if isDst && !drop {
								want = headByte(seed, b, sp, tok, gh, k)
							}
							if buf[i] != want {
								t.Fatalf("%v: decode rank %d buffer %d page %d (destination %v, dropped %v) token %d head %d byte %d: %#x, want %#x",
									sh, d, b, p, isDst, drop, tok, h, k, buf[i], want)
							}
							i++
						}
					}
				}
			}
		}
		wantAux := rm.aux
		if aux := g.m.DecodeRanks[d].AuxFrom; d == rm.dropD && aux == rm.dropS {
			wantAux = bytes.Repeat([]byte{0xAA}, tpAuxRow)
		}
		for row := range int64(tpAuxRows) {
			want := bytes.Repeat([]byte{0xAA}, tpAuxRow)
			if row == rm.auxRow {
				want = wantAux
			}
			if !bytes.Equal(r.AuxRow(row), want) {
				t.Fatalf("%v: decode rank %d aux row %d: %x, want %x", sh, d, row, r.AuxRow(row), want)
			}
		}
	}
}

func (g *tpRig) clearDestinations() {
	for _, r := range g.dst {
		for b := range g.sh.buffers {
			memset(r.Buffer(b), 0xAA)
		}
		for row := range int64(tpAuxRows) {
			memset(r.AuxRow(row), 0xAA)
		}
	}
}

// drawRoom draws a room's pages and, when some decode rank has several sources, maybe
// one stream to leave out.
func (g *tpRig) drawRoom(t *rapid.T, room uint64) tpRoom {
	n := rapid.IntRange(1, 8).Draw(t, "pages")
	rm := tpRoom{room: room, src: pageLists(t, "src", g.sh.buffers, n), dst: pageLists(t, "dst", g.sh.buffers, n),
		aux: bytes.Repeat([]byte{byte(room)}, tpAuxRow), auxRow: int64(rapid.IntRange(0, tpAuxRows-1).Draw(t, "aux_row")),
		dropS: -1, dropD: -1}
	if rapid.Bool().Draw(t, "drop") {
		d := rapid.IntRange(0, g.sh.decodeTP-1).Draw(t, "drop_decode")
		if from := g.m.DecodeRanks[d].From; len(from) > 1 {
			rm.dropD, rm.dropS = d, rapid.SampledFrom(from).Draw(t, "drop_prefill")
		}
	}
	return rm
}

var tpSizes = []int{1, 2, 4, 8}

func drawShape(t *rapid.T) tpShape {
	return tpShape{
		prefillTP:  rapid.SampledFrom(tpSizes).Draw(t, "prefill_tp"),
		decodeTP:   rapid.SampledFrom(tpSizes).Draw(t, "decode_tp"),
		heads:      rapid.SampledFrom([]int{1, 2, 4, 8, 16}).Draw(t, "heads"), // below tp: replicated
		headBytes:  rapid.SampledFrom([]int{4, 8, 16}).Draw(t, "head_bytes"),
		pageTokens: rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "page_tokens"),
		buffers:    rapid.IntRange(1, 3).Draw(t, "buffers"),
	}
}

// TestPropertySlicedTransferLandsEachHeadSlice moves rooms between random TP topologies
// (prefill and decode TP in 1, 2, 4, 8; heads that split or replicate) over MemNetwork:
// every destination byte equals the model head the decode rank holds there, from the
// source page paired with its page; a stream left out leaves exactly its head slices
// untouched (0xAA) while its siblings complete; no byte outside the destination pages is
// written.
func TestPropertySlicedTransferLandsEachHeadSlice(t *testing.T) {
	checkSlicedProperty(t, SenderConfig{}.Transport, func(rt *rapid.T, g *tpRig, _ tpShape, rm tpRoom, seed uint64) {
		g.move(rt, rm)
		g.check(rt, rm, seed)
	})
}

// checkSlicedProperty draws shapes, chunk sizes and one or two rooms per shape, and has
// each room moved and checked by moveRoom, the senders on transport kind.
func checkSlicedProperty(t *testing.T, kind Kind, moveRoom func(rt *rapid.T, g *tpRig, sh tpShape, rm tpRoom, seed uint64)) {
	var room uint64
	rapid.Check(t, func(rt *rapid.T) {
		sh := drawShape(rt)
		chunk := int64(rapid.SampledFrom([]int{64, 256, 4096}).Draw(rt, "max_chunk"))
		g := newTPRig(rt, sh, false, SenderConfig{MaxChunkBytes: chunk, ConnsPerPeer: 1, Transport: kind})
		defer g.close()
		seed := rapid.Uint64().Draw(rt, "seed")
		g.fillSources(seed)
		for range rapid.IntRange(1, 2).Draw(rt, "rooms") {
			room++
			g.clearDestinations()
			moveRoom(rt, g, sh, g.drawRoom(rt, room), seed)
		}
	})
}

// fixedTPRoom is the tables' room: four scattered pages per rank, an aux row.
func fixedTPRoom() tpRoom {
	return tpRoom{room: 1, src: [][]int32{{3, 4, 5, 9}, {0, 11, 7, 8}}, dst: [][]int32{{1, 2, 10, 6}, {5, 4, 3, 2}},
		aux: bytes.Repeat([]byte{7}, tpAuxRow), auxRow: 1, dropS: -1, dropD: -1}
}

// TestSlicedTransferOverTCP is the property's mappings of the issue (2 -> 4, 4 -> 2,
// 1 -> 8, 8 -> 1, and replicated heads: GQA with fewer KV heads than one side's ranks,
// each way) over loopback TCP, with the default chunk size.
func TestSlicedTransferOverTCP(t *testing.T) {
	for i, sh := range []tpShape{
		{prefillTP: 2, decodeTP: 4, heads: 8, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 4, decodeTP: 2, heads: 8, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 1, decodeTP: 8, heads: 8, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 8, decodeTP: 1, heads: 8, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 8, decodeTP: 2, heads: 4, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 2, decodeTP: 4, heads: 2, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 1, decodeTP: 2, heads: 1, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 1, decodeTP: 4, heads: 2, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 2, decodeTP: 8, heads: 4, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 4, decodeTP: 2, heads: 2, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 2, decodeTP: 1, heads: 1, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 4, decodeTP: 1, heads: 2, headBytes: 16, pageTokens: 4, buffers: 2},
		// rows of 8 KiB, past the receiver's 4 KiB pieces: each read where it lands
		{prefillTP: 2, decodeTP: 1, heads: 16, headBytes: 1024, pageTokens: 2, buffers: 2},
	} {
		t.Run(sh.String(), func(t *testing.T) {
			g := newTPRig(t, sh, true, SenderConfig{})
			defer g.close()
			g.fillSources(uint64(i) + 1)
			g.clearDestinations()
			rm := fixedTPRoom()
			g.move(t, rm)
			g.check(t, rm, uint64(i)+1)
		})
	}
}

// TestSlicedMappingsRefusedWhenLayoutsCannotMap: random pairs of TP sizes and head counts
// (3 and 6 among them) are refused by PlanRanks exactly when a side's heads and TP do not
// divide or the TP sizes do not, naming the reason; and copies that do not fit a region
// are refused by Open and Expect before anything is sent.
func TestSlicedMappingsRefusedWhenLayoutsCannotMap(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := rapid.SampledFrom([]int{1, 2, 3, 4, 8}).Draw(rt, "prefill_tp")
		d := rapid.SampledFrom([]int{1, 2, 3, 4, 8}).Draw(rt, "decode_tp")
		heads := rapid.SampledFrom([]int{1, 2, 3, 4, 6, 8, 16}).Draw(rt, "heads")
		sh := tpShape{prefillTP: p, decodeTP: d, heads: heads, headBytes: 8, pageTokens: 2, buffers: 1}
		divides := func(a, b int) bool { return a%b == 0 || b%a == 0 }
		want := divides(heads, p) && divides(heads, d) && divides(p, d)
		_, err := PlanRanks(sh.layout(p, 0), sh.layout(d, 0))
		if (err == nil) != want {
			rt.Fatalf("%v: PlanRanks %v, want mappable %v", sh, err, want)
		}
		if err != nil && RefusalReason(err) == "other" {
			rt.Fatalf("%v: refusal %v names no reason", sh, err)
		}
	})

	sh := tpShape{prefillTP: 2, decodeTP: 4, heads: 8, headBytes: 16, pageTokens: 4, buffers: 1}
	g := newTPRig(t, sh, false, SenderConfig{})
	defer g.close()
	good := g.m.CopiesFrom(0, 0)[0]
	for _, c := range []struct {
		name string
		edit func(*rankmap.Copy)
	}{
		{"heads past the destination row", func(c *rankmap.Copy) { c.DstHead++ }},
		{"heads past the source row", func(c *rankmap.Copy) { c.SrcHead = 3 }},
		{"no heads", func(c *rankmap.Copy) { c.Heads = 0 }},
		{"another page size", func(c *rankmap.Copy) { c.PageTokens *= 2 }},
		{"a buffer the layout lacks", func(c *rankmap.Copy) { c.Buffer = 1 }},
	} {
		bad := good
		c.edit(&bad)
		k := streamKey(99, 0, 0, 4)
		dst := [][]Run{{{0, 1}}}
		errE := g.rcv[0].Expect(Expectation{Key: k, Dst: dst, AuxRow: -1, Copies: []rankmap.Copy{bad}})
		errS := g.snd[0].Send(t.Context(), SendRequest{Peer: g.addr[0], Key: k, Src: dst, Dst: dst, Copies: []rankmap.Copy{bad}})
		if !errors.Is(errE, ErrBadSlice) || !errors.Is(errS, ErrBadSlice) {
			t.Errorf("%s: Expect %v, Send %v, want ErrBadSlice from both", c.name, errE, errS)
		}
		g.rcv[0].Fence(k)
	}
	overlap := []rankmap.Copy{good, good}
	if err := g.rcv[0].Expect(Expectation{Key: streamKey(98, 0, 0, 4), Dst: [][]Run{{{0, 1}}}, AuxRow: -1, Copies: overlap}); !errors.Is(err, ErrBadSlice) {
		t.Errorf("two copies of the same heads: %v, want ErrBadSlice", err)
	}
}

// slicedReceiver is a receiver over the fuzz layout (two buffers of eight 512-byte pages,
// read as 4 tokens of 128-byte rows) expecting fuzzSlicedKey's slices, and a whole-page
// room on page 5 of each buffer.
func slicedReceiver(t *testing.T) (*Receiver, *Region, *events, string, Key) {
	return slicedReceiverOn(t, ReceiverConfig{}.Transport)
}

// slicedReceiverOn is slicedReceiver with the receiver on transport kind.
func slicedReceiverOn(t *testing.T, kind Kind) (*Receiver, *Region, *events, string, Key) {
	rcv, dst, ev, addr := rawReceiver(t, UniformLayout(2, 8, 512, 1, 16), ReceiverConfig{Transport: kind})
	memset(dst.Buffer(0), 0xAA)
	memset(dst.Buffer(1), 0xAA)
	if err := rcv.Expect(Expectation{Key: fuzzSlicedKey, Dst: [][]Run{{{6, 1}}, {{7, 1}}}, AuxRow: -1, Copies: fuzzSlices}); err != nil {
		t.Fatal(err)
	}
	whole := Key{Room: 43, Nonce: 1}
	if err := rcv.Expect(Expectation{Key: whole, Dst: SamePages(2, []Run{{5, 1}}), AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	return rcv, dst, ev, addr, whole
}

// untouched reports whether every byte of b is 0xAA.
func untouched(b []byte) bool { return bytes.Count(b, []byte{0xAA}) == len(b) }

// TestSlicedChunkLandsOnlyItsHeads: the seed stream of head slices completes, its heads
// land at their destination offset in every token row, and every other byte of those
// pages is untouched.
func TestSlicedChunkLandsOnlyItsHeads(t *testing.T) {
	_, dst, ev, addr, _ := slicedReceiver(t)
	sk := fuzzSlicedKey
	payload := make([]byte, 4*2*32+4*1*32)
	fill(payload, 5)
	c := dialRaw(t, addr)
	c.write(append(slicedChunkHeader(sk, 0, fuzzSliceRuns, 4, payload), payload...))
	c.write(doneFrame(sk, 1, 2, nil))
	if res := c.sync(); res[sk] != uint32(codeOK) {
		t.Fatalf("result %d, want ok", res[sk])
	}
	if r, ok := ev.get(sk); !ok || r != "" {
		t.Fatalf("outcome %q (reported %v), want complete", r, ok)
	}
	headsLanded(t, dst, payload)
}

// headsLanded checks fuzzSlicedKey's pages in dst: in every token row each slice holds its
// part of payload (the slices' bytes in wire order) at its destination head, and every
// other byte is untouched.
func headsLanded(t *testing.T, dst *Region, payload []byte) {
	t.Helper()
	off := 0
	for _, cp := range fuzzSlices {
		page := dst.Pages(cp.Buffer, Run{int32(6 + cp.Buffer), 1})
		n := cp.Heads * cp.HeadBytes
		for tok := range cp.PageTokens {
			row := page[tok*cp.DstRow : (tok+1)*cp.DstRow]
			at := cp.DstHead * cp.HeadBytes
			if !bytes.Equal(row[at:at+n], payload[off:off+n]) {
				t.Fatalf("buffer %d token %d: heads not at head %d", cp.Buffer, tok, cp.DstHead)
			}
			if !untouched(row[:at]) || !untouched(row[at+n:]) {
				t.Fatalf("buffer %d token %d: bytes outside the slice written", cp.Buffer, tok)
			}
			off += n
		}
	}
}

// TestSlicedRoomCompletesOnlyWhenEverySliceLanded: a stream that brings one of its two
// (page, slice) pairs and then DONE fails invalid, not Complete, whether its DONE counts
// the one pair it sent or claims both.
func TestSlicedRoomCompletesOnlyWhenEverySliceLanded(t *testing.T) {
	for _, donePages := range []uint32{1, 2} {
		t.Run(fmt.Sprintf("done says %d", donePages), func(t *testing.T) {
			_, _, ev, addr, _ := slicedReceiver(t)
			sk := fuzzSlicedKey
			payload := bytes.Repeat([]byte{3}, 4*2*32)
			c := dialRaw(t, addr)
			c.write(append(slicedChunkHeader(sk, 0, fuzzSliceRuns[:1], 4, payload), payload...))
			c.write(doneFrame(sk, 1, donePages, nil))
			res := c.sync()
			if r, ok := ev.get(sk); !ok || r != ReasonInvalid || res[sk] != uint32(codeInvalid) {
				t.Fatalf("outcome %q (reported %v), result %d; want invalid", r, ok, res[sk])
			}
		})
	}
}

// TestSlicedChunkRefusesRepeatedOrForeignSlices: a chunk naming one (page, slice) twice, a
// slice overlapping the expected heads, a slice past its row, a sliced chunk for a room of
// whole pages and whole pages for a room of slices each fail their room invalid before a
// byte lands.
func TestSlicedChunkRefusesRepeatedOrForeignSlices(t *testing.T) {
	shifted := fuzzSliceRuns[0]
	shifted.DstHead = 1 // overlaps heads 2-3 without being them
	for _, c := range []struct {
		name  string
		runs  []SliceRun
		whole bool // send whole pages instead
		key   func(whole Key) Key
	}{
		{"repeated slice", []SliceRun{fuzzSliceRuns[0], fuzzSliceRuns[0]}, false, nil},
		{"overlapping heads", []SliceRun{shifted}, false, nil},
		{"another source head", []SliceRun{{ChunkRun: fuzzSliceRuns[0].ChunkRun, SrcHead: 1, DstHead: 2, Heads: 2, HeadBytes: 32, RowBytes: 128}}, false, nil},
		{"another row size", []SliceRun{{ChunkRun: fuzzSliceRuns[0].ChunkRun, DstHead: 2, Heads: 2, HeadBytes: 32, RowBytes: 256}}, false, nil},
		{"slices for a room of whole pages", []SliceRun{{ChunkRun: ChunkRun{0, Run{5, 1}}, Heads: 4, HeadBytes: 32, RowBytes: 128}}, false,
			func(whole Key) Key { return whole }},
		{"whole pages for a room of slices", nil, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			rcv, dst, ev, addr, whole := slicedReceiver(t)
			k := fuzzSlicedKey
			if c.key != nil {
				k = c.key(whole)
			}
			conn := dialRaw(t, addr)
			if c.whole {
				page := bytes.Repeat([]byte{3}, 512)
				conn.write(append(chunkHeader(k, 0, 0, []Run{{6, 1}}, 512, page), page...))
			} else {
				var n int64
				for _, r := range c.runs {
					n += int64(r.Count) * r.sliceBytes(4)
				}
				payload := bytes.Repeat([]byte{3}, int(n))
				conn.write(append(slicedChunkHeader(k, 0, c.runs, 4, payload), payload...))
			}
			res := conn.sync()
			if r, ok := ev.get(k); !ok || r != ReasonInvalid || res[k] != uint32(codeInvalid) {
				t.Fatalf("outcome %q (reported %v), result %d; want invalid", r, ok, res[k])
			}
			if !untouched(dst.Buffer(0)) || !untouched(dst.Buffer(1)) {
				t.Fatal("a refused chunk wrote")
			}
			if n := rcv.Stats().RejectedFrames; n != 1 {
				t.Fatalf("%d rejected frames, want 1", n)
			}
		})
	}
}

// TestSliceDescriptorPastItsRowBreaksTheConnection: a run list whose slice lies outside its
// row is refused by the decoder (ErrBadSlice) and cannot delimit a payload: the connection
// closes and nothing lands.
func TestSliceDescriptorPastItsRowBreaksTheConnection(t *testing.T) {
	rcv, dst, _, addr, _ := slicedReceiver(t)
	past := fuzzSliceRuns[0]
	past.DstHead = 3 // heads 3-4 of a 4-head row
	if _, err := DecodeSliceRuns(nil, AppendSliceRuns(nil, []SliceRun{past}), 1,
		RunsChecksum(AppendSliceRuns(nil, []SliceRun{past}))); !errors.Is(err, ErrBadSlice) {
		t.Fatalf("decode: %v, want ErrBadSlice", err)
	}
	payload := bytes.Repeat([]byte{3}, 256)
	c := dialRaw(t, addr)
	c.write(append(slicedChunkHeader(fuzzSlicedKey, 0, []SliceRun{past}, 4, payload), payload...))
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [HeaderSize]byte
	n, err := io.ReadFull(c.c, hdr[:])
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("after a slice past its row the connection answered %d bytes (%v), want it closed", n, err)
	}
	if !untouched(dst.Buffer(0)) || !untouched(dst.Buffer(1)) || rcv.Stats().RejectedFrames != 1 {
		t.Fatalf("after a slice past its row: %d rejected, buffers untouched %v %v", rcv.Stats().RejectedFrames,
			untouched(dst.Buffer(0)), untouched(dst.Buffer(1)))
	}
}

// TestSlicedFenceMidChunkNoRowLandsAfter_R7 is TestFenceMidChunkNoByteLandsAfter_R7 for
// head slices (scatter's staged pieces): a room fenced while a piece of its rows is on the
// wire waits for that piece, then not one more row lands although the rest of the chunk
// and its DONE arrive, and no byte outside the slice was ever written.
func TestSlicedFenceMidChunkNoRowLandsAfter_R7(t *testing.T) {
	const item, row = 4096, 128 // 32 tokens of 4 heads of 32 bytes
	l := UniformLayout(1, 16, item, 0, 0)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{PieceBytes: 4096})
	memset(dst.Buffer(0), 0xAA)
	slice := rankmap.Copy{SrcHead: 0, DstHead: 2, Heads: 2, HeadBytes: 32, PageTokens: 32, SrcRow: 64, DstRow: row}
	k := Key{Room: 1, Nonce: 2}
	if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{0, 8}}}, AuxRow: -1, Copies: []rankmap.Copy{slice}}); err != nil {
		t.Fatal(err)
	}
	runs := []SliceRun{sliceRunOf(slice, Run{0, 8})}
	payload := bytes.Repeat([]byte{0x11}, 8*32*64) // 2 KiB per page: a piece is two pages' rows
	c := dialRaw(t, addr)
	c.write(append(slicedChunkHeader(k, 0, runs, 32, payload), payload[:4096]...))
	landed := func(p int) bool { // the last row of page p has its heads
		r := dst.Pages(0, Run{int32(p), 1})[item-row:]
		return bytes.Equal(r[64:], payload[:64])
	}
	waitFor(t, func() bool { return landed(1) })

	fenced := make(chan struct{})
	go func() { rcv.FenceWait(k); close(fenced) }()
	select {
	case <-fenced:
		t.Fatal("Fence returned while a piece of the room's rows was being read")
	case <-time.After(50 * time.Millisecond):
	}
	c.write(payload[4096:8192]) // completes the piece in progress
	select {
	case <-fenced:
	case <-time.After(5 * time.Second):
		t.Fatal("Fence did not return after the piece in progress landed")
	}
	after := bytes.Clone(dst.Buffer(0))
	c.write(payload[8192:])
	c.write(doneFrame(k, 1, 8, nil))
	if res := c.sync(); res[k] != uint32(codeFenced) {
		t.Fatalf("DONE for a fenced room answered %d, want fenced", res[k])
	}
	if !bytes.Equal(after, dst.Buffer(0)) {
		t.Fatal("rows landed after Fence returned")
	}
	if !untouched(dst.Pages(0, Run{4, 12})) {
		t.Fatal("pages after the fence point were written")
	}
	for tok := range 4 * 32 { // pages 0-3: only heads 2-3 of each row
		r := dst.Buffer(0)[tok*row : (tok+1)*row]
		if !untouched(r[:64]) {
			t.Fatalf("row %d: bytes outside the slice written", tok)
		}
	}
	if _, ok := ev.get(k); ok {
		t.Fatal("a fenced room must not report an outcome")
	}
}
