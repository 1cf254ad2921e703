package transfer

import (
	"bytes"
	"testing"
)

// Two prefill ranks' head-slice streams into one decode rank's pages (MHA 4 -> 2) are two
// keys that differ by From only. One stream's chunk is lost (its DONE counts a chunk that
// never came): that stream fails, its heads are never written, and the other completes with
// its own heads; neither stream's frames are taken for the other's.
func TestLostChunkOfOnePrefillRanksSlicesFailsOnlyItsStream_R11(t *testing.T) {
	l := UniformLayout(2, 8, 512, 1, 16)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{})
	memset(dst.Buffer(0), 0xAA)
	memset(dst.Buffer(1), 0xAA)
	sent, lost := fuzzFromKey, fuzzFromKey
	sent.From, lost.From = Rank{TP: 2, Size: 4}, Rank{TP: 3, Size: 4}
	pages := [][]Run{{{6, 1}}, {{7, 1}}}
	if err := rcv.Expect(Expectation{Key: sent, Dst: pages, AuxRow: -1, Copies: fuzzFromSlices}); err != nil {
		t.Fatal(err)
	}
	if err := rcv.Expect(Expectation{Key: lost, Dst: pages, AuxRow: -1, Copies: fuzzSlices}); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, addr)
	payload := bytes.Repeat([]byte{3}, 4*2*32+4*1*32)
	c.write(append(slicedChunkHeader(sent, 0, fuzzFromRuns, 4, payload), payload...))
	c.write(doneFrame(lost, 1, 2, nil)) // its one chunk was lost on the way
	c.write(doneFrame(sent, 1, 2, nil))
	if r := ev.wait(t, sent); r != "" {
		t.Fatalf("the stream whose chunk arrived: %q, want complete", r)
	}
	if r := ev.wait(t, lost); r == "" {
		t.Fatal("the stream whose chunk was lost completed")
	}
	for _, cp := range fuzzSlices { // the lost stream's heads: untouched
		page := dst.Pages(cp.Buffer, Run{int32(6 + cp.Buffer), 1})
		for tok := range cp.PageTokens {
			at := tok*cp.DstRow + cp.DstHead*cp.HeadBytes
			if got := page[at : at+cp.Heads*cp.HeadBytes]; !bytes.Equal(got, bytes.Repeat([]byte{0xAA}, len(got))) {
				t.Fatalf("buffer %d token %d: the lost stream's heads were written", cp.Buffer, tok)
			}
		}
	}
	for _, cp := range fuzzFromSlices { // the sent stream's heads: its bytes
		page := dst.Pages(cp.Buffer, Run{int32(6 + cp.Buffer), 1})
		for tok := range cp.PageTokens {
			at := tok*cp.DstRow + cp.DstHead*cp.HeadBytes
			if got := page[at : at+cp.Heads*cp.HeadBytes]; !bytes.Equal(got, bytes.Repeat([]byte{3}, len(got))) {
				t.Fatalf("buffer %d token %d: the sent stream's heads are not its bytes", cp.Buffer, tok)
			}
		}
	}
}
