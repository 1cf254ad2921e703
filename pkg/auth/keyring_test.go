package auth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestOpenRefusesUnusableTokenFilesWithAClearMessage(t *testing.T) {
	long := strings.Repeat("s", MinTokenLen)
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string // in the message
	}{
		{"empty", "", 0o600, "holds no token"},
		{"only blanks and comments", "\n  \n# rotated 2024-01-01\n\t\n", 0o600, "holds no token"},
		{"short", "tooshort\n", 0o600, "line 1"},
		{"short second line", long + "\n\nshort-token\n", 0o600, "line 3"},
		{"too many", strings.Join([]string{long + "1", long + "2", long + "3", long + "4", long + "5"}, "\n"), 0o600, "at most 4"},
		{"world writable", long, 0o622, "writable by every user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeTokenFile(t, t.TempDir(), tc.content, tc.mode)
			_, err := Open(Config{Path: p})
			if !errors.Is(err, ErrTokenFile) {
				t.Fatalf("err = %v, want ErrTokenFile", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, p) {
				t.Fatalf("message %q should name the file and say %q", msg, tc.want)
			}
			if strings.Contains(msg, "tooshort") || strings.Contains(msg, "short-token") {
				t.Fatalf("message %q leaks the token", msg)
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		_, err := Open(Config{Path: filepath.Join(t.TempDir(), "nope")})
		if !errors.Is(err, ErrTokenFile) || !errors.Is(err, os.ErrNotExist) && !strings.Contains(err.Error(), "no such file") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		if _, err := Open(Config{Path: t.TempDir()}); !errors.Is(err, ErrTokenFile) || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("no path", func(t *testing.T) {
		if _, err := Open(Config{}); !errors.Is(err, ErrTokenFile) {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestOpenWarnsAboutAWorldReadableFile(t *testing.T) {
	p := writeTokenFile(t, t.TempDir(), string(tokOld)+"\n", 0o644)
	k, err := Open(Config{Path: p})
	if err != nil {
		t.Fatal(err)
	}
	w := k.Status().Warnings
	if len(w) != 1 || !strings.Contains(w[0], "readable by every user") || !strings.Contains(w[0], "0644") {
		t.Fatalf("warnings = %q", w)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Reload(); err != nil {
		t.Fatal(err)
	}
	if w := k.Status().Warnings; len(w) != 0 {
		t.Fatalf("warnings after chmod = %q", w)
	}
}

func TestOpenTrimsWhitespaceAndSkipsComments(t *testing.T) {
	clk := newFakeClock()
	p := writeTokenFile(t, t.TempDir(), "# deployment token\n\n  "+string(tokOld)+" \r\n", 0o600)
	k, err := Open(Config{Path: p, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	ref := mustNew(t, clk, 0, 0, tokOld)
	if k.Fingerprint() != ref.Fingerprint() {
		t.Fatalf("fingerprint %s, want %s (same token)", k.Fingerprint(), ref.Fingerprint())
	}
	frame := []byte("envelope")
	mac, _ := k.Control(SidePrefill).Seal(frame)
	if err := ref.Control(SideDecode).Verify(frame, mac); err != nil {
		t.Fatal(err)
	}
}

func TestReloadOfABadFileKeepsTheTokensInForce(t *testing.T) {
	clk := newFakeClock()
	dir := t.TempDir()
	p := writeTokenFile(t, dir, string(tokOld), 0o600)
	k, err := Open(Config{Path: p, Now: clk.Now, Overlap: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	before := k.Fingerprint()
	writeTokenFile(t, dir, "short", 0o600)
	if changed, err := k.Reload(); changed || !errors.Is(err, ErrTokenFile) {
		t.Fatalf("Reload = %v, %v; want refusal", changed, err)
	}
	if k.Fingerprint() != before || len(k.Status().Accepted) != 1 {
		t.Fatalf("a refused reload changed the keyring: %+v", k.Status())
	}
	if s := k.Stats(); s.ReloadErrors != 1 || s.Reloads != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestReloadOfTheSameFileChangesNothing(t *testing.T) {
	clk := newFakeClock()
	p := writeTokenFile(t, t.TempDir(), string(tokOld), 0o600)
	k, err := Open(Config{Path: p, Now: clk.Now, Overlap: time.Minute, PromoteDelay: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := k.Reload(); changed || err != nil {
		t.Fatalf("Reload = %v, %v", changed, err)
	}
	if s := k.Stats(); s.Reloads != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestReloadWithoutAFileIsRefused(t *testing.T) {
	k := mustNew(t, newFakeClock(), 0, 0, tokOld)
	if _, err := k.Reload(); !errors.Is(err, ErrTokenFile) {
		t.Fatalf("err = %v", err)
	}
}

func TestNewRefusesShortDuplicateOrTooManyTokens(t *testing.T) {
	for name, tokens := range map[string][][]byte{
		"none":      nil,
		"short":     {[]byte("short")},
		"duplicate": {tokOld, tokOld},
		"too many":  {tok('a'), tok('b'), tok('c'), tok('d'), tok('e')},
	} {
		if _, err := New(Config{}, tokens...); !errors.Is(err, ErrTokenFile) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestFingerprintsAreStableDistinctAndHideTheToken(t *testing.T) {
	clk := newFakeClock()
	a, b, c := mustNew(t, clk, 0, 0, tokOld), mustNew(t, clk, 0, 0, tokOld), mustNew(t, clk, 0, 0, tokNew)
	if a.Fingerprint() != b.Fingerprint() || a.Fingerprint() == c.Fingerprint() || len(a.Fingerprint()) != 8 {
		t.Fatalf("fingerprints %s %s %s", a.Fingerprint(), b.Fingerprint(), c.Fingerprint())
	}
	if strings.Contains(string(tokOld), a.Fingerprint()) {
		t.Fatal("fingerprint is part of the token")
	}
}

func TestStatusShowsAPendingPromotionAndExpiries(t *testing.T) {
	clk := newFakeClock()
	k := mustNew(t, clk, 5*time.Minute, 2*time.Minute, tokOld)
	old := k.Fingerprint()
	if _, err := k.Rotate(tokNew); err != nil {
		t.Fatal(err)
	}
	st := k.Status()
	if st.Signing != old || st.Next == "" || !st.PromoteAt.Equal(clk.Now().Add(2*time.Minute)) {
		t.Fatalf("status %+v", st)
	}
	if len(st.Accepted) != 2 || !st.Accepted[0].NotAfter.Equal(clk.Now().Add(7*time.Minute)) || !st.Accepted[1].NotAfter.IsZero() {
		t.Fatalf("accepted %+v", st.Accepted)
	}
	clk.Advance(2 * time.Minute)
	st = k.Status()
	if st.Signing == old || st.Next != "" || len(st.Accepted) != 2 || st.Accepted[1].Fingerprint != old {
		t.Fatalf("after promotion %+v", st)
	}
	clk.Advance(5 * time.Minute)
	if st = k.Status(); len(st.Accepted) != 1 {
		t.Fatalf("after overlap %+v", st)
	}
}
