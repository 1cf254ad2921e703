//go:build linux

package transfer

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"
	"unsafe"

	"go.uber.org/zap"
)

// A region file can shrink under its mapping at any time: the engine (or an operator)
// truncates it while a worker copies its pages. Mapping.Check catches that before a room
// starts; a truncation while pages are being copied makes the next access past the new end
// raise SIGBUS, which would kill the daemon. Every access to mapped region memory from a
// transfer goroutine therefore runs inside touchRegion, with the runtime's panic-on-fault set
// for exactly that access, and a fault inside a live mapping becomes a RegionFaultError that
// fails the rooms that were being copied, never the process. The kernel reports the same
// truncation as EFAULT when the access is a read(2) or write(2) straight from or into the
// mapping; regionIOError counts and wraps those alike.

// mapped is every live Mapping's address range, so a fault can be told apart from a real
// memory bug: only an address inside one is recovered.
var mapped = struct {
	sync.Mutex
	m map[*Mapping]struct{}
}{m: make(map[*Mapping]struct{})}

func trackMapping(m *Mapping) {
	mapped.Lock()
	mapped.m[m] = struct{}{}
	mapped.Unlock()
}

func untrackMapping(m *Mapping) {
	mapped.Lock()
	delete(mapped.m, m)
	mapped.Unlock()
}

// mappingAt returns the live mapping that holds addr, or nil.
func mappingAt(addr uintptr) *Mapping {
	mapped.Lock()
	defer mapped.Unlock()
	for m := range mapped.m {
		if len(m.mem) == 0 {
			continue
		}
		base := uintptr(unsafe.Pointer(unsafe.SliceData(m.mem)))
		if addr >= base && addr-base < uintptr(len(m.mem)) {
			return m
		}
	}
	return nil
}

// RegionFaultError is a fault (SIGBUS or EFAULT) on mapped region memory: the file behind the
// mapping was truncated while its pages were being copied. It wraps ErrRegionFault.
type RegionFaultError struct {
	Path string  // the mapped file, "" when the kernel did not say where (EFAULT)
	Addr uintptr // the faulting address, 0 when unknown
	Err  error   // the runtime's fault or the system call's error
}

func (e *RegionFaultError) Error() string {
	if e.Addr != 0 {
		return fmt.Sprintf("%v: %s at %#x: %v", ErrRegionFault, e.Path, e.Addr, e.Err)
	}
	return fmt.Sprintf("%v: %v", ErrRegionFault, e.Err)
}

func (e *RegionFaultError) Unwrap() []error { return []error{ErrRegionFault, e.Err} }

// faultAddr is what the runtime's fault panics carry under SetPanicOnFault.
type faultAddr interface {
	runtime.Error
	Addr() uintptr
}

// recoverRegionFault turns v, a value recovered on a goroutine touching region memory, into
// a *RegionFaultError when it is a memory fault inside a live mapping, logging once per
// mapping and counting it on region (nil: a write of no region memory, counted nowhere). Anything else is re-panicked: a fault outside every
// mapping is memory corruption, not a truncated file, and must not be hidden.
func recoverRegionFault(region *Region, log *zap.Logger, v any) error {
	f, ok := v.(faultAddr)
	if !ok {
		panic(v)
	}
	m := mappingAt(f.Addr())
	if m == nil {
		panic(v)
	}
	if region != nil {
		region.faults.Add(1)
	}
	if m.faultLogged.CompareAndSwap(false, true) {
		log.Error("region memory fault: the file was truncated while its pages were copied; its rooms fail with transfer_error",
			zap.String("region", m.id.Path), zap.Uint64("generation", m.id.Generation), zap.Uintptr("addr", f.Addr()))
	}
	return &RegionFaultError{Path: m.id.Path, Addr: f.Addr(), Err: f}
}

// touchRegion runs access, which reads or writes region memory, with panic-on-fault set on
// this goroutine for just that call, and returns the fault recovered into an error (nil when
// none). before, if set, runs first under the same setting (tests hold a worker there).
func touchRegion(region *Region, log *zap.Logger, before func(), access func()) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if v := recover(); v != nil {
			err = recoverRegionFault(region, log, v)
		}
	}()
	if before != nil {
		before()
	}
	access()
	return nil
}

// copyRegionBytes returns a copy of b, which may be region memory (an aux row), or the
// fault that copying it met. It returns nil for an empty b.
func copyRegionBytes(region *Region, log *zap.Logger, b []byte) (out []byte, err error) {
	if len(b) == 0 {
		return nil, nil
	}
	out = make([]byte, len(b))
	if err := touchRegion(region, log, nil, func() { copy(out, b) }); err != nil {
		return nil, err
	}
	return out, nil
}

// regionIOError wraps err as a *RegionFaultError, counted on region, when a system call
// reading into or writing from region memory failed with EFAULT (the kernel's word for the
// same truncation); any other error is returned as it is.
func regionIOError(region *Region, log *zap.Logger, err error) error {
	if err == nil || !errors.Is(err, syscall.EFAULT) {
		return err
	}
	if region == nil {
		return &RegionFaultError{Err: err}
	}
	region.faults.Add(1)
	if m := region.Current(); m != nil && m.faultLogged.CompareAndSwap(false, true) {
		log.Error("region memory fault: the file was truncated while its pages were copied; its rooms fail with transfer_error",
			zap.String("region", m.id.Path), zap.Uint64("generation", m.id.Generation), zap.Error(err))
	}
	return &RegionFaultError{Err: err}
}

// Faults is how many faults on this region's memory were recovered into room failures
// (pdlink_region_faults_total).
func (r *Region) Faults() uint64 { return r.faults.Load() }
