//go:build linux

package transfer

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Region is an engine's KV memory file mapped MAP_SHARED into the daemon. The engine maps
// the same file, so bytes the receiver writes are the engine's KV cache.
//
// A Region is a handle onto one Mapping at a time: the file an engine registered, identified
// by path, device, inode and a generation. When the engine replaces the file (a restart that
// recreates it at the same path, or another path or layout for the rank), the daemon fences
// the rooms that use the current mapping, installs the new one with Replace, and unmaps the
// old one only once those fences are done (I9): a worker that was fenced mid-copy still
// holds slices of the old mapping, never of the new one, and a write that is still landing
// lands in memory that is still mapped. Senders and Receivers hold the Region, not the
// Mapping, so they need not be rebuilt.
//
// The mapping is pre-faulted when it is opened (MAP_POPULATE), never on the transfer path.
// A Region must outlive every Sender or Receiver that uses it: Close it only after they are
// closed.
type Region struct {
	mu  sync.Mutex // serialises Replace and Close
	cur atomic.Pointer[Mapping]
	// faults counts faults on its mappings' memory recovered into room failures (fault.go).
	faults atomic.Uint64
}

// Mapping is one registered file mapped read-write shared: what a Region serves between two
// Replace calls.
type Mapping struct {
	id     RegionID
	layout Layout
	mem    []byte
	bufs   [][]byte // one slice per buffer, into mem
	aux    []byte
	closed atomic.Bool
	// faultLogged is set by the first fault on the mapping, which alone is logged.
	faultLogged atomic.Bool
	// renewals counts Renew: the engine registered this file again (same generation).
	renewals atomic.Uint64
}

// RegionID names one mapped file: the path it was opened at, the device and inode the open
// found there, and the generation the daemon gave it (1 for the first file of a rank, then
// one more for each replacement). Two registrations with the same path but another device
// or inode are two files: the engine deleted and recreated it.
type RegionID struct {
	Path       string `json:"path"`
	Dev        uint64 `json:"dev"`
	Ino        uint64 `json:"ino"`
	Generation uint64 `json:"generation"`
}

// SameFile reports whether o names the same file (path, device and inode), whatever its
// generation.
func (id RegionID) SameFile(o RegionID) bool {
	return id.Path == o.Path && id.Dev == o.Dev && id.Ino == o.Ino
}

// OpenRegion maps the file at path (any path; /dev/shm by default in the daemons) with the
// given layout as generation 1. It validates the layout, checks the file is large enough,
// maps it read-write shared and pre-faults every page.
func OpenRegion(path string, layout Layout) (*Region, error) {
	m, err := OpenMapping(path, layout)
	if err != nil {
		return nil, err
	}
	m.id.Generation = 1
	r := &Region{}
	r.cur.Store(m)
	return r, nil
}

// NewEmptyRegion returns a Region with no mapping yet: Layout is the zero Layout and every
// page accessor returns nil until Replace installs one. A rank that is unregistered keeps its
// Region so the data plane built over it stays.
func NewEmptyRegion() *Region { return &Region{} }

// OpenMapping maps the file at path with layout, as OpenRegion does, without installing it
// in any Region: the caller checks it (and the file's identity) before Replace. Its
// generation is 0 until Replace gives it one.
func OpenMapping(path string, layout Layout) (*Mapping, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open region: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat region: %w", err)
	}
	size := layout.Size()
	if st.Size < size {
		return nil, fmt.Errorf("%w: %s has %d bytes, layout needs %d", ErrRegionTooSmall, path, st.Size, size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap region %s: %w", path, err)
	}
	m := &Mapping{id: RegionID{Path: path, Dev: uint64(st.Dev), Ino: st.Ino}, layout: layout, mem: mem}
	for _, b := range layout.Buffers {
		m.bufs = append(m.bufs, mem[b.Offset:b.Offset+b.Length:b.Offset+b.Length])
	}
	if a := layout.Aux; a.Rows > 0 {
		end := a.Offset + a.Rows*a.RowLen
		m.aux = mem[a.Offset:end:end]
	}
	trackMapping(m)
	return m, nil
}

// ID returns the mapped file's identity.
func (m *Mapping) ID() RegionID { return m.id }

// Layout returns the mapping's layout.
func (m *Mapping) Layout() Layout { return m.layout }

// Renew records that the engine registered the mapped file again, the same file with the
// same layout (so the same generation): for instance once a file truncated under its
// layout has its size back. Each Sender connection then offers the file anew before its
// next same-host chunk of the rank, and decode proves it again (open, identity, size):
// an offer it had kept as gone (found truncated at a chunk's stat) or an answer that
// refused the file holds no longer. A new generation needs no Renew: its identity is new.
func (m *Mapping) Renew() { m.renewals.Add(1) }

// Renewals is how many times Renew was called on the mapping.
func (m *Mapping) Renewals() uint64 { return m.renewals.Load() }

// Close unmaps the mapping. Nothing may read or write it any more: the Region no longer
// serves it, and every room that used it is fenced and its fence done. Its slices stay as
// they were (a receiver that loaded it before the Replace may still be looking up a claimed
// chunk's pages, without a lock: the fence keeps it from touching them); from now on the
// lookups answer nil.
func (m *Mapping) Close() error {
	if m == nil || !m.closed.CompareAndSwap(false, true) {
		return ErrRegionClosed
	}
	mem := m.mem
	untrackMapping(m)
	if err := unix.Munmap(mem); err != nil {
		return fmt.Errorf("munmap region: %w", err)
	}
	return nil
}

// Check stats path and reports whether the file there is still the one mapped, whole:
// ErrRegionReplaced when it was deleted or replaced (another device or inode), ErrRegionTooSmall
// when it was truncated below the layout (touching the pages past its end would fault), nil
// when it is. One stat(2), no open; BenchmarkRegionCheck measures it.
func (m *Mapping) Check() error {
	var st unix.Stat_t
	if err := unix.Stat(m.id.Path, &st); err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("%w: %s is gone", ErrRegionReplaced, m.id.Path)
		}
		return fmt.Errorf("stat region: %w", err)
	}
	if uint64(st.Dev) != m.id.Dev || st.Ino != m.id.Ino {
		return fmt.Errorf("%w: %s is another file (inode %d, mapped %d)", ErrRegionReplaced, m.id.Path, st.Ino, m.id.Ino)
	}
	if size := m.layout.Size(); st.Size < size {
		return fmt.Errorf("%w: %s was truncated to %d bytes, layout needs %d", ErrRegionTooSmall, m.id.Path, st.Size, size)
	}
	return nil
}

// Replace installs next as the Region's mapping with generation gen and returns the one it
// served before (nil if none). next may be nil: the Region serves nothing (unregistered).
// The caller fences every room that uses the old mapping before Replace, and closes the old
// mapping only once those fences are done.
func (r *Region) Replace(next *Mapping, gen uint64) (old *Mapping) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if next != nil {
		next.id.Generation = gen
	}
	return r.cur.Swap(next)
}

// Current returns the mapping the Region serves (nil if none).
func (r *Region) Current() *Mapping { return r.cur.Load() }

// CreateRegionFile creates a file in dir (os.TempDir if empty; /dev/shm is a good choice)
// sized for layout and returns its path. The caller removes it. For tests and demos.
func CreateRegionFile(dir string, layout Layout) (string, error) {
	if err := layout.Validate(); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, "pdlink-region-*")
	if err != nil {
		return "", fmt.Errorf("create region file: %w", err)
	}
	if err := f.Truncate(layout.Size()); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", fmt.Errorf("size region file: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("close region file: %w", err)
	}
	return f.Name(), nil
}

// Layout returns the current mapping's layout (the zero Layout when none is mapped).
func (r *Region) Layout() Layout {
	if m := r.cur.Load(); m != nil {
		return m.layout
	}
	return Layout{}
}

// Path returns the current mapping's path ("" when none is mapped).
func (r *Region) Path() string {
	if m := r.cur.Load(); m != nil {
		return m.id.Path
	}
	return ""
}

// ID returns the current mapping's identity (the zero RegionID when none is mapped).
func (r *Region) ID() RegionID {
	if m := r.cur.Load(); m != nil {
		return m.id
	}
	return RegionID{}
}

// Buffer returns buffer i's bytes (nil if i is out of range or nothing is mapped).
func (r *Region) Buffer(i int) []byte {
	m := r.cur.Load()
	if m == nil || m.closed.Load() || i < 0 || i >= len(m.bufs) {
		return nil
	}
	return m.bufs[i]
}

// Pages returns the bytes of run within buffer i of the current mapping. The run must be
// valid for the buffer (see ValidateRuns); Pages panics otherwise, like a slice expression.
// With nothing mapped, the mapping closed, or a buffer the mapping does not have (a run checked against a
// mapping that was replaced since: its room is fenced and writes none of it), it returns nil.
func (r *Region) Pages(i int, run Run) []byte {
	m := r.cur.Load()
	if m == nil || m.closed.Load() || i >= len(m.bufs) {
		return nil
	}
	il := m.layout.Buffers[i].ItemLen
	start := int64(run.Start) * il
	end := start + int64(run.Count)*il
	if end > int64(len(m.bufs[i])) {
		return nil
	}
	return m.bufs[i][start:end:end]
}

// AuxRow returns aux row row, or nil if the current mapping has no such row.
func (r *Region) AuxRow(row int64) []byte {
	m := r.cur.Load()
	if m == nil || m.closed.Load() {
		return nil
	}
	a := m.layout.Aux
	if row < 0 || row >= a.Rows {
		return nil
	}
	return m.aux[row*a.RowLen : (row+1)*a.RowLen : (row+1)*a.RowLen]
}

// Close unmaps the current mapping. Every Sender and Receiver using it must be closed first.
func (r *Region) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.cur.Swap(nil)
	if m == nil {
		return ErrRegionClosed
	}
	return m.Close()
}
