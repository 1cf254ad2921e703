package transfer

import (
	"errors"
	"strings"
	"testing"
)

func TestLayoutValidateAndCompatible(t *testing.T) {
	base := UniformLayout(4, 16, 4096, 8, 64)
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		name string
		edit func(*Layout)
	}{
		{"no buffers", func(l *Layout) { l.Buffers = nil }},
		{"zero item_len", func(l *Layout) { l.Buffers[1].ItemLen = 0 }},
		{"partial page", func(l *Layout) { l.Buffers[0].Length = 4097 }},
		{"overlap", func(l *Layout) { l.Buffers[1].Offset = 100 }},
		{"aux overlaps", func(l *Layout) { l.Aux.Offset = 0 }},
		{"tp rank", func(l *Layout) { l.Rank.TP = 1 }},
	}
	for _, c := range bad {
		l := UniformLayout(4, 16, 4096, 8, 64)
		c.edit(&l)
		if err := l.Validate(); !errors.Is(err, ErrInvalidLayout) {
			t.Errorf("%s: %v, want ErrInvalidLayout", c.name, err)
		}
	}
	mismatch := []struct {
		other Layout
		says  string
	}{
		{UniformLayout(3, 16, 4096, 8, 64), "buffer count"},
		{UniformLayout(4, 16, 8192, 8, 64), "item_len"},
		{UniformLayout(4, 16, 4096, 8, 32), "aux row_len"},
	}
	for _, c := range mismatch {
		err := base.Compatible(c.other)
		if !errors.Is(err, ErrIncompatibleLayout) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Compatible: %v, want a mismatch naming %q", err, c.says)
		}
	}
	if err := base.Compatible(UniformLayout(4, 1000, 4096, 2, 64)); err != nil {
		t.Errorf("different page counts must be compatible: %v", err)
	}
}

func TestOpenRegionRefusesShortFile(t *testing.T) {
	small := UniformLayout(1, 4, 4096, 0, 0)
	path, err := CreateRegionFile(t.TempDir(), small)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenRegion(path, UniformLayout(1, 8, 4096, 0, 0)); !errors.Is(err, ErrRegionTooSmall) {
		t.Fatalf("%v, want ErrRegionTooSmall", err)
	}
}

func TestAddPeerRefusesIncompatibleLayout(t *testing.T) {
	l := UniformLayout(2, 8, 4096, 0, 0)
	snd, err := NewSender(openTestRegion(t, l), SenderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	if err := snd.AddPeer("127.0.0.1:1", UniformLayout(2, 8, 2048, 0, 0)); !errors.Is(err, ErrIncompatibleLayout) {
		t.Fatalf("%v, want ErrIncompatibleLayout", err)
	}
}

// TestAddPeerAgainChecksOnlyAChangedLayout: the daemons add the peer at every bind; adding
// a known peer again with its layout is a no-op, and with another layout still checked.
func TestAddPeerAgainChecksOnlyAChangedLayout(t *testing.T) {
	l := UniformLayout(2, 8, 4096, 0, 0)
	snd, err := NewSender(openTestRegion(t, l), SenderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	const addr = "127.0.0.1:1"
	if err := snd.AddPeer(addr, l); err != nil {
		t.Fatal(err)
	}
	if err := snd.AddPeer(addr, l); err != nil {
		t.Fatalf("add the peer again with its layout: %v", err)
	}
	if err := snd.AddPeer(addr, UniformLayout(2, 8, 2048, 0, 0)); !errors.Is(err, ErrIncompatibleLayout) {
		t.Fatalf("add the peer again with another page size: %v, want ErrIncompatibleLayout", err)
	}
	more := UniformLayout(2, 16, 4096, 0, 0) // compatible: page counts may differ
	if err := snd.AddPeer(addr, more); err != nil {
		t.Fatalf("add the peer again with more pages: %v", err)
	}
}
