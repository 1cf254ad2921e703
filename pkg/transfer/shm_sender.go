package transfer

import (
	"fmt"
	"hash/crc32"
	"time"

	"go.uber.org/zap"
)

// txShm is a data connection's same-host state. ranks and next are the writer's; acks is
// under txConn.mu (the reader takes them at COPIED).
type txShm struct {
	ranks     map[Rank]shmOfferState // by source rank: the last offer and its answer
	next      uint32                 // the last offer id used on the connection
	answers   chan Header            // SHM_ANSWER frames, from the reader to the writer
	acks      map[shmAckKey]shmAck   // shm chunks written, not yet COPIED
	runs      []ShmRun
	sliceRuns []ShmSliceRun
	counted   bool // this connection counts in shmCounters.conns (writer only)
}

type shmOfferState struct {
	id    RegionID
	offer uint32
	// renewals is the mapping's Renewals when it was offered: a Renew since (the engine
	// registered the file again) makes the writer offer it again.
	renewals uint64
	accepted bool
	caps     ShmCaps // the accepting decode's
	// saidNoSlices: a sliced stream of the rank was sent by tcp for want of ShmCapSlices,
	// logged and counted (once per connection, rank and offer).
	saidNoSlices bool
}

type shmAckKey struct {
	key Key
	seq uint32
}

type shmAck struct {
	w      *piece
	charge int64
}

func newTxShm() txShm {
	return txShm{ranks: map[Rank]shmOfferState{}, answers: make(chan Header, 4), acks: map[shmAckKey]shmAck{}}
}

// ShmStats returns the sender's same-host counters.
func (s *Sender) ShmStats() ShmStats { return s.shm.stats() }

// shmPopulateRate is the slowest rate, in bytes per second, at which a decoded of the
// previous build maps an offered file with MAP_POPULATE before it answers
// (BenchmarkShmOfferMap/prefault: 1.5-3.4 GB/s on the shared 2-core machine at load 9-10,
// so this is a sixth of the slowest). This build answers once the file is proven and
// mapped, pre-faulting it afterwards, but the wire is the same, so a rolling upgrade may
// pair a new prefilld with an old decoded: a fixed wait would refuse same-host pages to
// its every region past a size.
const shmPopulateRate = 256 << 20

// shmOfferWait is how long a writer waits for the answer to an offer of size bytes: base,
// plus the time to map them at shmPopulateRate.
func shmOfferWait(base time.Duration, size int64) time.Duration {
	return base + time.Duration(float64(size)/shmPopulateRate*float64(time.Second))
}

// shmSourceFor returns the offer id this connection copies w's pages by, negotiating it
// first when the stream's source rank has no answer on the connection for its region's
// current file (a first chunk, a new generation, or the same file registered again since
// its answer: Mapping.Renew). false: the pages go as payload (tcp, no pages, the peer
// refused, or a stream of head slices and a peer that copies whole pages only). An error
// is the connection's.
func (tc *txConn) shmSourceFor(j *job, w *piece) (uint32, bool, error) {
	s := tc.p.s
	if s.cfg.Transport == KindTCP || len(w.plans) == 0 {
		return 0, false, nil
	}
	src := j.st.Source
	if src == (Rank{}) {
		src = j.st.Key.Rank
	}
	m := j.region.Current()
	if m == nil {
		return 0, false, nil
	}
	st, ok := tc.shm.ranks[src]
	if renewals := m.Renewals(); !ok || st.id != m.ID() || st.renewals != renewals {
		if ok && st.id == m.ID() {
			tc.reofferShm(src, st, renewals)
		}
		var err error
		if st, err = tc.offerShm(src, m, renewals); err != nil {
			return 0, false, err
		}
	}
	if st.accepted && w.plans[0].sliced && st.caps&ShmCapSlices == 0 {
		if !st.saidNoSlices {
			st.saidNoSlices = true
			tc.shm.ranks[src] = st
			s.shm.add(&shmTotals.prefill, func(c *shmCounters) { c.fallbacks[ShmNoSlices].Add(1) })
			s.log.Warn("same-host head slices not copied by the peer, tcp for this rank's sliced streams",
				zap.String("peer", tc.p.addr), zap.Uint16("prefill_rank", src.TP), zap.String("region", st.id.Path),
				zap.String("reason", ShmNoSlices.String()), zap.String("transport", string(s.cfg.Transport)))
		}
		return 0, false, nil
	}
	return st.offer, st.accepted, nil
}

// reofferShm counts and logs that source rank src's file, answered before on this
// connection (prev), is offered again because the engine registered it again: a decode
// that found it truncated, or refused it, proves it again, and its new answer replaces
// the old one for the rank (decode retires the older offer as for a new generation).
func (tc *txConn) reofferShm(src Rank, prev shmOfferState, renewals uint64) {
	s := tc.p.s
	s.shm.add(&shmTotals.prefill, func(c *shmCounters) { c.reoffers.Add(1) })
	s.log.Info("same-host pages offered again: the region was registered again", zap.String("peer", tc.p.addr),
		zap.Uint16("prefill_rank", src.TP), zap.String("region", prev.id.Path), zap.Uint64("generation", prev.id.Generation),
		zap.Bool("was_accepted", prev.accepted), zap.Uint64("renewals", renewals))
}

// offerShm sends m's SHM_OFFER for source rank src and waits for its answer, which it
// records for the rank with renewals (m's Renewals read before the offer). An error is
// the connection's.
func (tc *txConn) offerShm(src Rank, m *Mapping, renewals uint64) (shmOfferState, error) {
	s := tc.p.s
	id := m.ID()
	tc.shm.next++
	offer := tc.shm.next
	o := NewShmOffer(m)
	payload := AppendShmOffer(nil, o)
	var hdr [HeaderSize]byte
	(&Header{Type: FrameShmOffer, Flags: FlagPayloadCRC, Rank: src, Seq: offer, PayloadLen: uint64(len(payload)),
		PayloadCRC: crc32.Checksum(payload, castagnoli)}).Encode(hdr[:])
	if err := tc.write([][]byte{hdr[:], payload}, HeaderSize+int64(len(payload))); err != nil {
		return shmOfferState{}, err
	}
	wait := shmOfferWait(s.cfg.ShmOfferTimeout, o.Size)
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case a := <-tc.shm.answers:
			if a.Seq != offer || a.Rank != src {
				continue // the answer to an offer this writer gave up on
			}
			code := ShmFallback(a.Status)
			st := shmOfferState{id: id, offer: offer, renewals: renewals, accepted: code == ShmAccepted}
			if st.accepted {
				st.caps = ShmCaps(a.Pages)
			}
			tc.shm.ranks[src] = st
			if code == ShmAccepted {
				s.shm.add(&shmTotals.prefill, func(c *shmCounters) { c.accepted.Add(1) })
				if !tc.shm.counted {
					tc.shm.counted = true
					s.shm.add(&shmTotals.prefill, func(c *shmCounters) { c.conns.Add(1) })
				}
				s.log.Info("same-host pages accepted", zap.String("peer", tc.p.addr), zap.Uint16("prefill_rank", src.TP),
					zap.String("region", id.Path), zap.Uint64("generation", id.Generation),
					zap.Bool("head_slices", st.caps&ShmCapSlices != 0))
				return st, nil
			}
			s.shm.add(&shmTotals.prefill, func(c *shmCounters) { c.fallbacks[code].Add(1) })
			s.log.Warn("same-host pages refused by the peer, tcp for this rank", zap.String("peer", tc.p.addr),
				zap.Uint16("prefill_rank", src.TP), zap.String("region", id.Path), zap.String("reason", code.String()),
				zap.String("transport", string(s.cfg.Transport)))
			return st, nil
		case <-t.C:
			return shmOfferState{}, fmt.Errorf("%w: no answer to the shm offer within %v", ErrConnBroken, wait)
		case <-tc.dead:
			return shmOfferState{}, tc.readErr
		case <-tc.p.done:
			return shmOfferState{}, tc.p.closeErr
		}
	}
}

// writeShmChunk writes w's chunk i as a shm chunk: its run list names the source pages
// (offer), for a sliced stream with each entry's slice (ShmSliceRun), no payload; DONE
// follows the last one in the same write. crc is the checksum goroutine's over the chunk's
// payload as TCP would send it (a slice's gathered rows), the order decode sums its copy
// in. The chunk holds its budget and a reader of its job until COPIED (or the
// connection's end).
func (tc *txConn) writeShmChunk(w *piece, i int, flags uint16, crc uint32, offer uint32) (pieceEnd, error) {
	j := w.j
	c := &w.plans[i]
	if c.sliced {
		tc.encodeShmSliceRuns(c, offer)
	} else {
		tc.shm.runs = tc.shm.runs[:0]
		for k, r := range c.runs {
			tc.shm.runs = append(tc.shm.runs, ShmRun{ChunkRun: r, SrcStart: c.srcStarts[k], Offer: offer})
		}
		tc.meta = AppendShmRuns(append(tc.meta[:0], zeroHeader[:]...), tc.shm.runs)
	}
	h := Header{Type: FrameChunk, Flags: flags | FlagShm | c.flags(), Room: j.st.Key.Room, Nonce: j.st.Key.Nonce,
		Rank: j.st.Key.Rank, From: j.st.Key.From, Seq: j.seq, NumRuns: c.entries(), Pages: uint32(c.pages), PayloadCRC: crc,
		RunsCRC: RunsChecksum(tc.meta[HeaderSize:])}
	h.Encode(tc.meta)
	iov, n := [][]byte{tc.meta}, int64(len(tc.meta))
	if w.last && i == len(w.plans)-1 {
		tc.encodeDone(j, w, flags, j.seq+1, j.sentPages+c.pages)
		iov = append(iov, tc.hdr[:], w.aux)
		n += HeaderSize + int64(len(w.aux))
	}
	k := shmAckKey{key: j.st.Key, seq: j.seq}
	tc.mu.Lock()
	tc.shm.acks[k] = shmAck{w: w, charge: w.charges[i]}
	tc.mu.Unlock()
	tc.p.hold(w, w.charges[i])
	if !j.acquireWrite(tc, n) {
		tc.takeAck(k, false)
		return pieceAbandoned, nil
	}
	j.mu.Lock()
	j.shmUnacked++
	j.mu.Unlock()
	// Armed by acquireWrite alone: re-arming here could undo a fence's interrupt. No
	// region memory is written: the aux row is a copy.
	if err := tc.writeArmed(nil, iov); err != nil {
		tc.takeAck(k, true)
		return pieceAbandoned, err
	}
	j.seq++
	j.sentPages += c.pages
	w.written++
	if progress := j.st.Progress; progress != nil {
		progress(c.bytes)
	}
	return pieceWritten, nil
}

// takeAck ends a shm chunk's hold: its budget goes back and, if it was written (read),
// its reader of the job lets go.
func (tc *txConn) takeAck(k shmAckKey, read bool) {
	tc.mu.Lock()
	a, ok := tc.shm.acks[k]
	delete(tc.shm.acks, k)
	tc.mu.Unlock()
	if !ok {
		return
	}
	tc.p.unhold(a.w, a.charge)
	if read {
		j := a.w.j
		j.mu.Lock()
		j.shmUnacked--
		j.mu.Unlock()
		j.release()
	}
}

// shmAnswer hands a SHM_ANSWER to the writer waiting for it (dropped if none waits).
func (tc *txConn) shmAnswer(h Header) {
	select {
	case tc.shm.answers <- h:
	default:
	}
}

// shmCopied takes a COPIED: decode no longer reads the chunk's source pages.
func (tc *txConn) shmCopied(h Header) { tc.takeAck(shmAckKey{key: h.Key(), seq: h.Seq}, true) }

// shmConnEnded frees the holds of the shm chunks the connection never saw COPIED: decode
// copies no chunk of a connection it no longer reads.
func (tc *txConn) shmConnEnded() {
	tc.mu.Lock()
	keys := make([]shmAckKey, 0, len(tc.shm.acks))
	for k := range tc.shm.acks {
		keys = append(keys, k)
	}
	tc.mu.Unlock()
	for _, k := range keys {
		tc.takeAck(k, true)
	}
	if tc.shm.counted {
		tc.shm.counted = false
		tc.p.s.shm.add(&shmTotals.prefill, func(c *shmCounters) { c.conns.Add(-1) })
	}
}

// hold marks n bytes of w's budget as held by a shm chunk until its COPIED.
func (p *peer) hold(w *piece, n int64) {
	p.mu.Lock()
	w.shmHeld += n
	p.mu.Unlock()
}

// unhold gives a shm chunk's n bytes back to the budget.
func (p *peer) unhold(w *piece, n int64) {
	p.mu.Lock()
	w.shmHeld -= n
	p.releaseLocked(w, n)
	p.unlock()
}

// releaseUnheld gives back what w holds beyond its shm chunks awaiting COPIED.
func (p *peer) releaseUnheld(w *piece) {
	p.mu.Lock()
	p.releaseLocked(w, w.left-w.shmHeld)
	p.unlock()
}
