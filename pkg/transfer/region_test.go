//go:build linux

package transfer

import (
	"errors"
	"os"
	"testing"
)

func newRegionFile(t testing.TB) (string, Layout) {
	t.Helper()
	l := UniformLayout(2, 16, 4096, 4, 64)
	path, err := CreateRegionFile(t.TempDir(), l)
	if err != nil {
		t.Fatal(err)
	}
	return path, l
}

// Check tells the mapped file from one recreated at its path (another
// inode), a deleted one and a truncated one.
func TestMappingCheckSeesAReplacedDeletedOrTruncatedFile(t *testing.T) {
	path, l := newRegionFile(t)
	r, err := OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m := r.Current()
	if err := m.Check(); err != nil {
		t.Fatalf("Check of the mapped file: %v", err)
	}
	if id := r.ID(); id.Generation != 1 || id.Ino == 0 || id.Path != path {
		t.Fatalf("ID %+v", id)
	}
	if err := os.Truncate(path, l.Size()-1); err != nil {
		t.Fatal(err)
	}
	if err := m.Check(); !errors.Is(err, ErrRegionTooSmall) {
		t.Fatalf("Check of a truncated file: %v, want ErrRegionTooSmall", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := m.Check(); !errors.Is(err, ErrRegionReplaced) {
		t.Fatalf("Check of a deleted file: %v, want ErrRegionReplaced", err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(l.Size())
	f.Close()
	if err := m.Check(); !errors.Is(err, ErrRegionReplaced) {
		t.Fatalf("Check of a file recreated at the path: %v, want ErrRegionReplaced", err)
	}
}

// Replace serves the new mapping at once (pages, layout, identity) and
// hands back the old one still mapped: a writer holding its pages keeps
// writing into mapped memory until the caller closes it.
func TestReplaceServesTheNewMappingAndKeepsTheOldOneMapped(t *testing.T) {
	path, l := newRegionFile(t)
	r, err := OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	held := r.Pages(0, Run{Start: 0, Count: 1})
	path2, _ := newRegionFile(t)
	next, err := OpenMapping(path2, l)
	if err != nil {
		t.Fatal(err)
	}
	old := r.Replace(next, 2)
	if r.Path() != path2 || r.ID().Generation != 2 || old.ID().Path != path {
		t.Fatalf("after Replace: serving %+v, old %+v", r.ID(), old.ID())
	}
	held[0] = 7 // the old mapping is still mapped
	if r.Pages(0, Run{Start: 0, Count: 1})[0] != 0 {
		t.Fatal("a write through the old mapping's pages landed in the new file")
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); !errors.Is(err, ErrRegionClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if r.Replace(nil, 0) != next || r.Current() != nil || r.Pages(0, Run{Start: 0, Count: 1}) != nil || r.Layout().Size() != 0 {
		t.Fatal("a Region with no mapping still serves pages")
	}
	next.Close()
}

// A receiver looks up a claimed chunk's pages without a lock (the fence
// protocol, not the lookup, keeps a fenced room from writing them), so it
// can hold the mapping a RegisterRegion is replacing and closing. Found by
// the race detector in internal/service: Close cleared the mapping's
// slices while such a lookup read them. Close now leaves them as they
// were; a closed mapping's lookups answer nil.
func TestClosingAReplacedMappingWhileLookupsReadItIsNotARace(t *testing.T) {
	path, l := newRegionFile(t)
	r, err := OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	old := r.Current()
	looked := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			_ = r.Pages(0, Run{Start: 0, Count: 1})
			_ = r.Buffer(0)
			_ = r.AuxRow(0)
			if i == 0 {
				close(looked)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	<-looked
	path2, _ := newRegionFile(t)
	next, err := OpenMapping(path2, l)
	if err != nil {
		t.Fatal(err)
	}
	if r.Replace(next, 2) != old {
		t.Fatal("Replace did not hand back the mapping served before")
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-done
	// Through a Region that still serves it (a reader that loaded it before
	// the Replace sees the same): a closed mapping gives no bytes.
	stale := &Region{}
	stale.cur.Store(old)
	if stale.Pages(0, Run{Start: 0, Count: 1}) != nil || stale.Buffer(0) != nil || stale.AuxRow(0) != nil {
		t.Fatal("a closed mapping still hands out its (unmapped) bytes")
	}
}

// BenchmarkRegionCheck is the cost the replaced-file check adds to every
// prefill Send and decode SendMetadata: one stat(2) of the region path.
func BenchmarkRegionCheck(b *testing.B) {
	path, l := newRegionFile(b)
	for _, dir := range []string{"", "/dev/shm"} {
		name := "tmpdir"
		if dir != "" {
			name = "devshm"
			p, err := CreateRegionFile(dir, l)
			if err != nil {
				b.Skip(err)
			}
			defer os.Remove(p)
			path = p
		}
		b.Run(name, func(b *testing.B) {
			m, err := OpenMapping(path, l)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			b.ReportAllocs()
			for b.Loop() {
				if err := m.Check(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
