//go:build linux

package transfer

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openShmSource maps, read-only, the prefill region file an offer names, after proving it
// is the offered file: the open file's device and inode (fstat of the descriptor, not a
// stat of the path, so a file swapped between the two cannot pass) equal the offer's and
// it holds the offer's size. The mapping is tracked like a region's, so a fault on it (the
// file truncated mid-copy) is recovered by touchRegion. Its refusal says why, as the
// fallback reason.
//
// It does not pre-fault the mapping (no MAP_POPULATE): open, fstat and mmap take tens of
// microseconds whatever the size (BenchmarkShmOfferMap/answer), so the connection
// goroutine answers the offer at once and the Receiver's populate worker pre-faults it in
// the background (shm_populate.go); a chunk copied before that faults its source pages in
// on first touch.
func openShmSource(o ShmOffer) (*Mapping, ShmFallback, error) {
	f, err := os.OpenFile(o.ID.Path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, ShmOpen, fmt.Errorf("open prefill region: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, ShmOpen, fmt.Errorf("stat prefill region: %w", err)
	}
	if uint64(st.Dev) != o.ID.Dev || st.Ino != o.ID.Ino {
		return nil, ShmIdentity, fmt.Errorf("%w: %s is device %d inode %d, offered %d/%d",
			ErrRegionReplaced, o.ID.Path, st.Dev, st.Ino, o.ID.Dev, o.ID.Ino)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < o.Size {
		return nil, ShmIdentity, fmt.Errorf("%w: %s has %d bytes, offer needs %d", ErrRegionTooSmall, o.ID.Path, st.Size, o.Size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(o.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, ShmMap, fmt.Errorf("mmap prefill region %s: %w", o.ID.Path, err)
	}
	m := &Mapping{id: o.ID, layout: Layout{Buffers: o.Buffers}, mem: mem}
	for _, b := range o.Buffers {
		m.bufs = append(m.bufs, mem[b.Offset:b.Offset+b.Length:b.Offset+b.Length])
	}
	trackMapping(m)
	return m, ShmAccepted, nil
}

// sourcePages is the bytes of run in buffer b of a source mapping, or an error when the
// run is not inside it or its pages are not item bytes long.
func sourcePages(m *Mapping, b uint32, run Run, itemLen int64) ([]byte, error) {
	if uint64(b) >= uint64(len(m.bufs)) {
		return nil, fmt.Errorf("%w: buffer %d of %d", ErrShmSource, b, len(m.bufs))
	}
	spec := m.layout.Buffers[b]
	if spec.ItemLen != itemLen {
		return nil, fmt.Errorf("%w: buffer %d pages of %d bytes, destination %d", ErrShmSource, b, spec.ItemLen, itemLen)
	}
	start := int64(run.Start) * itemLen
	end := start + int64(run.Count)*itemLen
	if end > int64(len(m.bufs[b])) {
		return nil, fmt.Errorf("%w: buffer %d pages [%d,%d) past %d bytes", ErrShmSource, b, run.Start, run.end(), len(m.bufs[b]))
	}
	return m.bufs[b][start:end:end], nil
}

// isRegionGone reports whether err says the source file was deleted, replaced or truncated.
func isRegionGone(err error) bool {
	return errors.Is(err, ErrRegionReplaced) || errors.Is(err, ErrRegionTooSmall)
}
