//go:build linux

package transfer

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Region is an engine's KV memory file mapped MAP_SHARED into the daemon. The engine maps
// the same file, so bytes the receiver writes are the engine's KV cache.
//
// The mapping is pre-faulted when the region is opened (MAP_POPULATE), never on the transfer
// path. A Region must outlive every Sender or Receiver that uses it: Close it only after
// they are closed.
type Region struct {
	path   string
	layout Layout
	mu     sync.Mutex
	mem    []byte
	bufs   [][]byte // one slice per buffer, into mem
	aux    []byte
}

// OpenRegion maps the file at path (any path; /dev/shm by default in the daemons) with the
// given layout. It validates the layout, checks the file is large enough, maps it read-write
// shared and pre-faults every page.
func OpenRegion(path string, layout Layout) (*Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open region: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat region: %w", err)
	}
	size := layout.Size()
	if st.Size() < size {
		return nil, fmt.Errorf("%w: %s has %d bytes, layout needs %d", ErrRegionTooSmall, path, st.Size(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap region %s: %w", path, err)
	}
	r := &Region{path: path, layout: layout, mem: mem}
	for _, b := range layout.Buffers {
		r.bufs = append(r.bufs, mem[b.Offset:b.Offset+b.Length:b.Offset+b.Length])
	}
	if a := layout.Aux; a.Rows > 0 {
		end := a.Offset + a.Rows*a.RowLen
		r.aux = mem[a.Offset:end:end]
	}
	return r, nil
}

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

// Layout returns the region's layout.
func (r *Region) Layout() Layout { return r.layout }

// Path returns the mapped file's path.
func (r *Region) Path() string { return r.path }

// Buffer returns buffer i's bytes (nil if i is out of range).
func (r *Region) Buffer(i int) []byte {
	if i < 0 || i >= len(r.bufs) {
		return nil
	}
	return r.bufs[i]
}

// Pages returns the bytes of run within buffer i. The run must be valid for the buffer
// (see ValidateRuns); Pages panics otherwise, like a slice expression.
func (r *Region) Pages(i int, run Run) []byte {
	il := r.layout.Buffers[i].ItemLen
	start := int64(run.Start) * il
	end := start + int64(run.Count)*il
	return r.bufs[i][start:end:end]
}

// AuxRow returns aux row row, or nil if the region has no such row.
func (r *Region) AuxRow(row int64) []byte {
	a := r.layout.Aux
	if row < 0 || row >= a.Rows {
		return nil
	}
	return r.aux[row*a.RowLen : (row+1)*a.RowLen : (row+1)*a.RowLen]
}

// Close unmaps the region. Every Sender and Receiver using it must be closed first.
func (r *Region) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return ErrRegionClosed
	}
	err := unix.Munmap(r.mem)
	r.mem, r.bufs, r.aux = nil, nil, nil
	if err != nil {
		return fmt.Errorf("munmap region: %w", err)
	}
	return nil
}
