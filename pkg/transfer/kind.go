package transfer

import (
	"fmt"
	"strings"
)

// Kind names a data-plane implementation (--data-transport). The daemons build their
// Transport and Sink through NewTransport and NewSink, so a new implementation (same-host
// shared memory, RDMA) is a new Kind and a case in each constructor, not a change to the
// daemons.
type Kind string

// Data-plane implementations.
const (
	KindTCP Kind = "tcp" // pages over stream connections (Sender, Receiver)
	// KindAuto is the daemons' default: same-host pages where the peer proves it can map
	// the prefill region file (doc.go, "Same-host pages"), TCP for every other peer and rank.
	KindAuto Kind = "auto"
	// KindShm is same-host pages or nothing: a stream the peer cannot map fails
	// (ErrShmRefused), counted, rather than run over TCP.
	KindShm Kind = "shm"
)

// Kinds returns every Kind this build accepts, in a stable order, for flag help and for the
// error that refuses an unknown one.
func Kinds() []Kind { return []Kind{KindAuto, KindTCP, KindShm} }

// KindNames returns Kinds as one human list: "tcp" or "tcp or shm" or "tcp, shm or rdma".
func KindNames() string {
	names := make([]string, 0, len(Kinds()))
	for _, k := range Kinds() {
		names = append(names, string(k))
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// ParseKind parses a --data-transport value. There is no implicit default: the
// daemons' flag defaults to KindTCP, and an empty value is refused like any other.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds() {
		if Kind(s) == k {
			return k, nil
		}
	}
	return "", fmt.Errorf("%w: data transport %q (want %s)", ErrUnknownKind, s, KindNames())
}

// NewTransport returns the prefill side of kind's data plane, reading pages from regions
// (each stream from its key's rank's region).
func NewTransport(kind Kind, region RegionSet, cfg SenderConfig) (Transport, error) {
	switch kind {
	case KindTCP, KindAuto, KindShm:
		cfg.Transport = kind
		s, err := NewSender(region, cfg)
		if err != nil {
			return nil, err // not a Transport holding a nil *Sender
		}
		return s, nil
	}
	return nil, fmt.Errorf("%w: data transport %q (want %s)", ErrUnknownKind, kind, KindNames())
}

// NewSink returns the decode side of kind's data plane, writing pages into regions (each
// room into its key's rank's region) and reporting to events (which may be nil).
func NewSink(kind Kind, region RegionSet, cfg ReceiverConfig, events Events) (Sink, error) {
	switch kind {
	case KindTCP, KindAuto, KindShm:
		cfg.Transport = kind
		r, err := NewReceiver(region, cfg, events)
		if err != nil {
			return nil, err // not a Sink holding a nil *Receiver
		}
		return r, nil
	}
	return nil, fmt.Errorf("%w: data transport %q (want %s)", ErrUnknownKind, kind, KindNames())
}
