package transfer

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"
)

// TestFenceInterruptBetweenArmAndWriteIsNeverUndone: a fence's interrupt (its grace ran
// out: the write deadline set to now) lands after the writer armed a chunk's deadline
// under the job's lock and before the chunk's write. The interrupt stands: the write
// fails, the fence completes, and not a byte of the room reaches decode, on TCP and on
// shared memory alike. A write that armed its deadline again would go through: over shm
// decode would then copy pages prefill's fence had already given up.
func TestFenceInterruptBetweenArmAndWriteIsNeverUndone(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind Kind
	}{{"tcp", KindTCP}, {"shm", KindShm}} {
		t.Run(tc.name, func(t *testing.T) {
			l := UniformLayout(2, 4, 4096, 4, 64)
			fenced := make(chan Key, 1)
			watch := &writeWatch{d: &net.Dialer{}}
			sc := SenderConfig{ConnsPerPeer: 1, FenceGrace: time.Hour, Dialer: watch, OnFenced: func(k Key) { fenced <- k }}
			g := shmRig(t, l, tc.kind, tc.kind, sc, ReceiverConfig{})
			k := Key{Room: 1, Nonce: 1}
			var once sync.Once
			var sentBefore int64
			g.snd.afterArm = func(armed Key) {
				once.Do(func() {
					if g.snd.Fence(armed) {
						t.Error("fence done while the writer holds the room's pages")
					}
					g.snd.mu.Lock()
					j := g.snd.jobs[armed]
					g.snd.mu.Unlock()
					j.interrupt() // what the grace's timer runs, run at this exact point
					sentBefore = watch.sent.Load()
				})
			}
			all := SamePages(2, []Run{{0, 4}})
			if err := g.rcv.Expect(Expectation{Key: k, Dst: all, AuxRow: -1}); err != nil {
				t.Fatal(err)
			}
			done := g.openStream(t, k, all)
			g.append(t, k, Piece{Src: all, Last: true})
			waitFenced(t, fenced, k)
			if sent := watch.sent.Load() - sentBefore; sent != 0 {
				t.Fatalf("%d bytes written after the interrupt, want none", sent)
			}
			if n := g.snd.Stats().StalledInterrupts; n != 1 {
				t.Fatalf("%d interrupts counted, want 1", n)
			}
			zero := make([]byte, 4*4096)
			for b := range all {
				if !bytes.Equal(g.dst.Pages(b, all[b][0]), zero) {
					t.Fatalf("buffer %d: the interrupted chunk reached decode", b)
				}
			}
			select {
			case err := <-done:
				t.Fatalf("Done(%v) ran for a fenced room", err)
			default:
			}
			g.rcv.Fence(k)
		})
	}
}
