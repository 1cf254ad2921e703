package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"net"
	"testing"
	"time"
)

// BenchmarkSeal MACs a typical 200-byte envelope (frames/s = 1e9/ns_per_op).
func BenchmarkSeal(b *testing.B) {
	c := mustNew(b, newFakeClock(), 0, 0, tokOld).Control(SidePrefill)
	b.SetBytes(int64(len(frame200)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Seal(frame200); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify checks a 200-byte envelope: signed with the current token,
// with the previous one during an overlap (two HMACs), and a forgery
// against two accepted tokens (two HMACs and the retired scan).
func BenchmarkVerify(b *testing.B) {
	clk := newFakeClock()
	mac, _ := mustNew(b, clk, 0, 0, tokOld).Control(SideDecode).Seal(frame200)
	for _, tc := range []struct {
		name string
		k    *Keyring
		mac  []byte
	}{
		{"current", mustNew(b, clk, 0, 0, tokOld), mac},
		{"previous", func() *Keyring { k := mustNew(b, clk, time.Hour, 0, tokOld); _, _ = k.Rotate(tokNew); return k }(), mac},
		{"forged", func() *Keyring { k := mustNew(b, clk, time.Hour, 0, tokAlt); _, _ = k.Rotate(tokNew); return k }(), mac},
	} {
		b.Run(tc.name, func(b *testing.B) {
			v := tc.k.Control(SidePrefill)
			b.SetBytes(int64(len(frame200)))
			b.ReportAllocs()
			for b.Loop() {
				_ = v.Verify(frame200, tc.mac)
			}
		})
	}
}

// BenchmarkHMACBaseline is crypto/hmac with a fresh hmac.New per frame, the
// naive implementation Seal improves on.
func BenchmarkHMACBaseline(b *testing.B) {
	b.SetBytes(int64(len(frame200)))
	b.ReportAllocs()
	for b.Loop() {
		h := hmac.New(sha256.New, tokOld)
		h.Write(frame200)
		_ = h.Sum(nil)
	}
}

// BenchmarkChallenge runs the whole data-connection preface (handshakes/s):
// over net.Pipe (CPU and goroutine handoffs only) and over loopback TCP on
// an open connection (dial excluded).
func BenchmarkChallenge(b *testing.B) {
	k := mustNew(b, newFakeClock(), 0, 0, tokOld)
	run := func(b *testing.B, pair func() (net.Conn, net.Conn)) {
		b.ReportAllocs()
		ctx := context.Background()
		for b.Loop() {
			cc, sc := pair()
			done := make(chan error, 1)
			go func() {
				_, err := k.Data().Server(ctx, sc)
				done <- err
			}()
			if _, err := k.Data().Client(ctx, cc); err != nil {
				b.Fatal(err)
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			cc.Close()
			sc.Close()
		}
	}
	b.Run("pipe", func(b *testing.B) { run(b, net.Pipe) })
	b.Run("tcp", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		// Pre-dial outside the timed loop is not possible with b.Loop; dial
		// cost is reported separately by BenchmarkDialBaseline.
		run(b, func() (net.Conn, net.Conn) {
			acc := make(chan net.Conn, 1)
			go func() { c, _ := ln.Accept(); acc <- c }()
			cc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			return cc, <-acc
		})
	})
}

// BenchmarkDialBaseline is a loopback TCP dial+accept alone, to subtract
// from BenchmarkChallenge/tcp.
func BenchmarkDialBaseline(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	for b.Loop() {
		acc := make(chan net.Conn, 1)
		go func() { c, _ := ln.Accept(); acc <- c }()
		cc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		sc := <-acc
		cc.Close()
		sc.Close()
	}
}
