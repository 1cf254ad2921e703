package auth

import (
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// frame200 is a stand-in for a typical serialised envelope.
var frame200 = func() []byte {
	b := make([]byte, 200)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}()

func wantReason(t *testing.T, err error, want Reason, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v, want %v", err, sentinel)
	}
	if r, ok := ReasonOf(err); !ok || r != want {
		t.Fatalf("reason = %v (%v), want %v", r, ok, want)
	}
}

func TestSealVerifyRoundTrip(t *testing.T) {
	clk := newFakeClock()
	p, d := mustNew(t, clk, 0, 0, tokOld), mustNew(t, clk, 0, 0, tokOld)
	mac, err := p.Control(SidePrefill).Seal(frame200)
	if err != nil || len(mac) != MACLen {
		t.Fatalf("Seal = %x, %v", mac, err)
	}
	if err := d.Control(SideDecode).Verify(frame200, mac); err != nil {
		t.Fatalf("prefill -> decode: %v", err)
	}
	mac, _ = d.Control(SideDecode).Seal(frame200)
	if err := p.Control(SidePrefill).Verify(frame200, mac); err != nil {
		t.Fatalf("decode -> prefill: %v", err)
	}
	if s := d.Stats(); s.Verified != 1 || s.VerifiedOther != 0 || s.Sealed != 1 || s.RejectedTotal() != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestAFlippedBitAnywhereFailsVerify(t *testing.T) {
	clk := newFakeClock()
	k := mustNew(t, clk, 0, 0, tokOld)
	mac, _ := k.Control(SidePrefill).Seal(frame200)
	v := k.Control(SideDecode)
	for i := range len(frame200) * 8 {
		f := append([]byte(nil), frame200...)
		f[i/8] ^= 1 << (i % 8)
		wantReason(t, v.Verify(f, mac), ReasonMACInvalid, ErrMACInvalid)
	}
	for i := range MACLen * 8 {
		m := append([]byte(nil), mac...)
		m[i/8] ^= 1 << (i % 8)
		wantReason(t, v.Verify(frame200, m), ReasonMACInvalid, ErrMACInvalid)
	}
	wantReason(t, v.Verify(frame200[:199], mac), ReasonMACInvalid, ErrMACInvalid)
	wantReason(t, v.Verify(append(frame200[:200:200], 0), mac), ReasonMACInvalid, ErrMACInvalid)
	if got := k.Stats().Rejected(ReasonMACInvalid); got != uint64(len(frame200)*8+MACLen*8+2) {
		t.Fatalf("counted %d", got)
	}
}

func TestMissingOrMalformedMACFails(t *testing.T) {
	k := mustNew(t, newFakeClock(), 0, 0, tokOld)
	v := k.Control(SideDecode)
	wantReason(t, v.Verify(frame200, nil), ReasonMACMissing, ErrMACMissing)
	wantReason(t, v.Verify(frame200, make([]byte, 16)), ReasonMACMalformed, ErrMACMalformed)
	wantReason(t, v.Verify(frame200, make([]byte, MACLen+1)), ReasonMACMalformed, ErrMACMalformed)
}

func TestMACFromAnotherTokenFails(t *testing.T) {
	clk := newFakeClock()
	mac, _ := mustNew(t, clk, 0, 0, tokAlt).Control(SidePrefill).Seal(frame200)
	wantReason(t, mustNew(t, clk, 0, 0, tokOld).Control(SideDecode).Verify(frame200, mac), ReasonMACInvalid, ErrMACInvalid)
}

func TestAFrameReflectedToItsSenderFails(t *testing.T) {
	k := mustNew(t, newFakeClock(), 0, 0, tokOld)
	for _, side := range []Side{SidePrefill, SideDecode} {
		mac, _ := k.Control(side).Seal(frame200)
		wantReason(t, k.Control(side).Verify(frame200, mac), ReasonMACInvalid, ErrMACInvalid)
	}
}

// TestOldTokenVerifiesDuringTheOverlapAndFailsAfter: with no promote delay
// the file's new token signs at once; frames MAC'd with the old one are
// accepted for Overlap, then refused as retired (and counted so).
func TestOldTokenVerifiesDuringTheOverlapAndFailsAfter(t *testing.T) {
	clk := newFakeClock()
	dir := t.TempDir()
	path := writeTokenFile(t, dir, string(tokOld), 0o600)
	rcv, err := Open(Config{Path: path, Now: clk.Now, Overlap: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	oldSender := mustNew(t, clk, 0, 0, tokOld).Control(SidePrefill)
	v := rcv.Control(SideDecode)

	writeTokenFile(t, dir, string(tokNew)+"\n", 0o600)
	if changed, err := rcv.Reload(); !changed || err != nil {
		t.Fatalf("Reload = %v, %v", changed, err)
	}
	newMAC, _ := mustNew(t, clk, 0, 0, tokNew).Control(SidePrefill).Seal(frame200)
	oldMAC, _ := oldSender.Seal(frame200)
	clk.Advance(5*time.Minute - time.Nanosecond)
	if err := v.Verify(frame200, oldMAC); err != nil {
		t.Fatalf("old token inside the overlap: %v", err)
	}
	if err := v.Verify(frame200, newMAC); err != nil {
		t.Fatalf("new token: %v", err)
	}
	if s := rcv.Stats(); s.VerifiedOther != 1 || s.Reloads != 1 {
		t.Fatalf("stats %+v", s)
	}
	clk.Advance(time.Nanosecond)
	wantReason(t, v.Verify(frame200, oldMAC), ReasonMACRetired, ErrTokenRetired)
	// Still named after the next reload drops it for good.
	writeTokenFile(t, dir, string(tokNew)+"\n"+string(tokAlt)+"\n", 0o600)
	if _, err := rcv.Reload(); err != nil {
		t.Fatal(err)
	}
	wantReason(t, v.Verify(frame200, oldMAC), ReasonMACRetired, ErrTokenRetired)
	if err := v.Verify(frame200, newMAC); err != nil {
		t.Fatal(err)
	}
	// The receiver signs with the new token: a peer still on the old one refuses it.
	mac, _ := v.Seal(frame200)
	wantReason(t, mustNew(t, clk, 0, 0, tokOld).Control(SidePrefill).Verify(frame200, mac), ReasonMACInvalid, ErrMACInvalid)
}

func TestZeroOverlapRefusesTheOldTokenAtOnce(t *testing.T) {
	clk := newFakeClock()
	k := mustNew(t, clk, 0, 0, tokOld)
	oldMAC, _ := mustNew(t, clk, 0, 0, tokOld).Control(SidePrefill).Seal(frame200)
	if _, err := k.Rotate(tokNew); err != nil {
		t.Fatal(err)
	}
	wantReason(t, k.Control(SideDecode).Verify(frame200, oldMAC), ReasonMACRetired, ErrTokenRetired)
}

// TestPromoteDelayKeepsSigningWithTheOldToken: a reload accepts the new
// token at once but signs with the old one for PromoteDelay, so a peer that
// has not reloaded yet still verifies our frames.
func TestPromoteDelayKeepsSigningWithTheOldToken(t *testing.T) {
	clk := newFakeClock()
	a := mustNew(t, clk, 5*time.Minute, 2*time.Minute, tokOld)
	b := mustNew(t, clk, 5*time.Minute, 2*time.Minute, tokOld)
	if _, err := a.Rotate(tokNew); err != nil {
		t.Fatal(err)
	}
	mac, _ := a.Control(SidePrefill).Seal(frame200)
	if err := b.Control(SideDecode).Verify(frame200, mac); err != nil {
		t.Fatalf("b not reloaded yet: %v", err)
	}
	clk.Advance(2 * time.Minute)
	mac, _ = a.Control(SidePrefill).Seal(frame200)
	wantReason(t, b.Control(SideDecode).Verify(frame200, mac), ReasonMACInvalid, ErrMACInvalid)
}

func TestASecondSIGHUPDoesNotPostponeThePromotion(t *testing.T) {
	clk := newFakeClock()
	k := mustNew(t, clk, 5*time.Minute, 2*time.Minute, tokOld)
	if _, err := k.Rotate(tokNew); err != nil {
		t.Fatal(err)
	}
	at := k.Status().PromoteAt
	clk.Advance(time.Minute)
	// Same file with a comment edited: same tokens, nothing changes.
	if changed, _ := k.Rotate(tokNew); changed {
		t.Fatal("same tokens reported as a change")
	}
	// Same first token plus another one: the schedule stays.
	if _, err := k.Rotate(tokNew, tokAlt); err != nil {
		t.Fatal(err)
	}
	if got := k.Status().PromoteAt; !got.Equal(at) {
		t.Fatalf("promotion moved from %v to %v", at, got)
	}
}

func TestRevertingBeforePromotionCancelsIt(t *testing.T) {
	clk := newFakeClock()
	k := mustNew(t, clk, 5*time.Minute, 2*time.Minute, tokOld)
	old := k.Fingerprint()
	_, _ = k.Rotate(tokNew)
	_, _ = k.Rotate(tokOld)
	clk.Advance(time.Hour)
	if k.Fingerprint() != old || len(k.Status().Accepted) != 1 {
		t.Fatalf("status %+v", k.Status())
	}
}

// peerPair is a prefill and a decode keyring and the frames between them.
type peerPair struct{ p, d *Keyring }

func (pp peerPair) bothWays() error {
	mac, _ := pp.p.Control(SidePrefill).Seal(frame200)
	if err := pp.d.Control(SideDecode).Verify(frame200, mac); err != nil {
		return err
	}
	mac, _ = pp.d.Control(SideDecode).Seal(frame200)
	return pp.p.Control(SidePrefill).Verify(frame200, mac)
}

// TestRollingRotationNeverRejects_Property: with the one-step rotation
// (write the new token, SIGHUP every daemon), frames verify both ways at
// every instant as long as every daemon reloads within
// min(PromoteDelay, Overlap) of the first.
func TestRollingRotationNeverRejects_Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := newFakeClock()
		overlap := time.Duration(rapid.IntRange(1, 600).Draw(t, "overlap_s")) * time.Second
		promote := time.Duration(rapid.IntRange(1, 600).Draw(t, "promote_s")) * time.Second
		gap := time.Duration(rapid.Int64Range(0, int64(min(overlap, promote))-1).Draw(t, "gap"))
		prefillFirst := rapid.Bool().Draw(t, "prefill_first")
		pp := peerPair{mustNew(t, clk, overlap, promote, tokOld), mustNew(t, clk, overlap, promote, tokOld)}
		first, second := pp.p, pp.d
		if !prefillFirst {
			first, second = second, first
		}
		step := func(label string) {
			if err := pp.bothWays(); err != nil {
				t.Fatalf("%s at +%v: %v", label, clk.Now().Sub(time.Unix(1_700_000_000, 0)), err)
			}
		}
		step("before")
		_, _ = first.Rotate(tokNew)
		for _, d := range splitDuration(t, gap) {
			clk.Advance(d)
			step("between reloads")
		}
		_, _ = second.Rotate(tokNew)
		step("after both")
		for _, d := range splitDuration(t, promote+overlap+time.Second) {
			clk.Advance(d)
			step("settling")
		}
		if pp.p.Fingerprint() != pp.d.Fingerprint() || len(pp.p.Status().Accepted) != 1 || len(pp.d.Status().Accepted) != 1 {
			t.Fatalf("not settled on the new token: %+v %+v", pp.p.Status(), pp.d.Status())
		}
	})
}

// TestTwoStepRotationNeverRejects_Property: with no promote delay, the
// two-step rotation (file "old\nnew" everywhere, then "new" everywhere
// within Overlap) verifies at every instant, however long step 1 takes.
func TestTwoStepRotationNeverRejects_Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := newFakeClock()
		overlap := time.Duration(rapid.IntRange(1, 600).Draw(t, "overlap_s")) * time.Second
		gap1 := time.Duration(rapid.Int64Range(0, int64(time.Hour)).Draw(t, "gap1"))
		pause := time.Duration(rapid.Int64Range(0, int64(time.Hour)).Draw(t, "pause"))
		gap2 := time.Duration(rapid.Int64Range(0, int64(overlap)-1).Draw(t, "gap2"))
		pp := peerPair{mustNew(t, clk, overlap, 0, tokOld), mustNew(t, clk, overlap, 0, tokOld)}
		check := func(label string) {
			if err := pp.bothWays(); err != nil {
				t.Fatalf("%s: %v", label, err)
			}
		}
		_, _ = pp.p.Rotate(tokOld, tokNew)
		for _, d := range splitDuration(t, gap1) {
			clk.Advance(d)
			check("step 1")
		}
		_, _ = pp.d.Rotate(tokOld, tokNew)
		clk.Advance(pause)
		check("between steps")
		_, _ = pp.d.Rotate(tokNew)
		for _, d := range splitDuration(t, gap2) {
			clk.Advance(d)
			check("step 2")
		}
		_, _ = pp.p.Rotate(tokNew)
		clk.Advance(overlap)
		check("done")
	})
}

// TestRollingRotationSlowerThanThePromoteDelayRejects documents the limit
// of the one-step rotation.
func TestRollingRotationSlowerThanThePromoteDelayRejects(t *testing.T) {
	clk := newFakeClock()
	pp := peerPair{mustNew(t, clk, 5*time.Minute, 2*time.Minute, tokOld), mustNew(t, clk, 5*time.Minute, 2*time.Minute, tokOld)}
	_, _ = pp.p.Rotate(tokNew)
	clk.Advance(2 * time.Minute)
	if err := pp.bothWays(); !errors.Is(err, ErrMACInvalid) {
		t.Fatalf("err = %v, want a rejection (decode never reloaded)", err)
	}
}

// splitDuration cuts d into a few random steps that add up to d.
func splitDuration(t *rapid.T, d time.Duration) []time.Duration {
	n := rapid.IntRange(1, 6).Draw(t, "steps")
	var out []time.Duration
	left := d
	for i := 0; i < n-1 && left > 0; i++ {
		s := time.Duration(rapid.Int64Range(0, int64(left)).Draw(t, "step"))
		out = append(out, s)
		left -= s
	}
	return append(out, left)
}
