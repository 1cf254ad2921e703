package zmtp

import (
	"os"
	"testing"
	"time"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// Every way the guard closes a peer releases its socket, including the
// ones zmq4 alone would leak (an incompatible peer type) and rejections
// after zmq4 took the connection over.
func TestRejectedPeersLeakNoFileDescriptors(t *testing.T) {
	tr, l, c := hostileSetup(t, func(o *Options) { o.HandshakeTimeout = 200 * time.Millisecond })
	base := openFDs(t)
	const rounds = 10
	for i := range rounds {
		post := dialRaw(t, hostAddr(l)) // rejected after zmq4 took over
		_, _ = post.Write(handshake("post"))
		waitCount(t, "server bytes", func() uint64 { return uint64(post.received()) }, greetingLen+20)
		_, _ = post.Write(frameHeader(flagLong, 1<<50))

		pub := dialRaw(t, hostAddr(l)) // incompatible type
		_, _ = pub.Write(cat(greeting(), ready("PUB", "")))

		stall := dialRaw(t, hostAddr(l)) // handshake timeout
		_, _ = stall.Write(greeting())

		for _, p := range []*rawPeer{post, pub, stall} {
			if !p.closedByServer(2 * time.Second) {
				t.Fatalf("round %d: peer not closed", i)
			}
			p.close()
		}
	}
	waitCount(t, ReasonHandshakeTimeout, func() uint64 { return tr.Rejected(ReasonHandshakeTimeout) }, rounds)
	ping(t, l, c, 5*time.Second)
	deadline := time.Now().Add(3 * time.Second)
	for openFDs(t) > base+2 {
		if time.Now().After(deadline) {
			t.Fatalf("open fds %d, baseline %d: rejected peers leak", openFDs(t), base)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
