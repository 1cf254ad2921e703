// Package transfer is pdlink's KV data plane: the engine's KV memory mapped as regions, and
// the transport that moves one room's pages from a prefill region into a decode region.
//
// # Regions
//
// A Region is a file the engine maps too (under /dev/shm by default, any path allowed),
// mapped MAP_SHARED and pre-faulted with MAP_POPULATE when it is opened, never on the
// transfer path. Its Layout lists the buffers (one per layer K and V in MHA, one per layer in
// MLA), each with offset, length and page size (ItemLen), plus an aux buffer of fixed-size
// rows. Page p of buffer i is at Offset_i + p*ItemLen_i. A layout may also describe its
// pages' heads (Attention and each buffer's PageTokens, TotalHeads, RankHeads, HeadBytes);
// Layout.Validate checks a layout on its own, those fields' consistency included, naming the
// field (LayoutFieldError). PlanRanks is the one place a prefill and a decode layout become
// a rankmap.Mapping: described on both sides through rankmap.Plan, otherwise compared as
// opaque (buffer count, page sizes, aux row size and TP size equal: the identity); a
// refusal names the rankmap sentinel (RefusalReason gives its closed-set name).
// Layout.Compatible is PlanRanks without the mapping.
//
// A Region is a handle onto one Mapping at a time: a registered file, identified by path,
// device, inode and generation (RegionID). Mapping.Check stats the path (one stat(2)) and
// says whether the file there was replaced (ErrRegionReplaced) or truncated
// (ErrRegionTooSmall). To serve a new file the caller fences every room on the old mapping,
// installs the new one with Region.Replace (Senders and Receivers keep their Region), and
// closes the old Mapping only once those fences are done: a worker fenced mid-copy holds
// slices of the old mapping, which stays mapped until then.
//
// A file truncated while its pages are copied makes the next access past its new end fault
// (SIGBUS; EFAULT from a read or write system call). Every transfer access to region memory
// (the checksum pass and the chunk write on prefill, the aux row copy at Append, each piece
// read into destination pages on decode) runs inside touchRegion, with the runtime's
// panic-on-fault set for just that access: a fault at an address inside a live mapping is an
// ErrRegionFault that fails the rooms being copied with transfer_error (prefill: the
// connection breaks, as on a failed write; decode: the landing room only, its frame drained,
// the connection goes on), logged once per mapping and counted (Region.Faults). A fault
// anywhere else panics on: it is a bug, not a truncated file.
//
// # Wire
//
// Pages travel as runs ([]Run{Start, Count}, int32) per buffer. Append pairs the source and
// destination runs (Pair) into maximal segments that are consecutive on both sides and packs
// them, buffer after buffer, into chunks of at most MaxChunkBytes: a chunk's run list names
// the buffer of each run, so a small piece over many buffers is one chunk (a one-page room of
// 64 buffers is one CHUNK and a DONE). A chunk is a 64-byte little-endian header (magic,
// version 3, type, room, nonce, rank, seq, lengths, payload crc32c, run-list crc32c and a
// crc32c over the header itself), the destination run list ({buffer, start, count} each),
// and the payload: the source pages, written with one vectored write (net.Buffers) straight
// from the mapping. A DONE frame carries the stream's chunk and page totals (page-buffer
// pairs) and the aux row, in the same write as the stream's last chunk; the receiver
// answers each DONE, and any earlier failure, with a RESULT frame naming the same key. Idle
// senders ping; the receiver pongs. wire.go holds the framing and its field table; its
// decoders never panic and are fuzzed. Frames of another version (1, or 2: v3 only added
// sliced chunks, every whole-page byte but the version is v2's) are refused
// (ErrBadVersion): the frame is counted as rejected and its connection closed.
//
// # Head slices (MHA between different TP sizes)
//
// SGLang's KV page is token-major: PageTokens rows of RankHeads*HeadBytes bytes. Between TP
// sizes a stream (prefill rank s to decode rank d) carries rankmap's copies for the pair
// (Mapping.CopiesFrom(s, d)): in every token row, Heads heads from SrcHead of the source
// row to DstHead of the destination row. Stream.Copies and Expectation.Copies name them on
// each end (nil: whole pages, the identity's unchanged path). Such a stream's chunks are
// sliced (FlagSliced): each run-list entry is a SliceRun, the destination pages plus the
// slice (source heads, destination head, head bytes, destination row bytes), and its
// payload is exactly the slice's bytes, page by page, token by token. Whichever side's
// pages are not whole for the copy does the per-token work: the sender gathers with its
// vectored write (one iovec entry per token row, no copy in the daemon), the receiver
// scatters through its read buffering (one copy per row). Shipping whole source pages
// instead would cost, for 8 KV heads of 256 bytes in 64-token pages, prefill 2 -> decode 4:
// a prefill page is 64 KiB and each of the two decode ranks it feeds takes 32 KiB of it, so
// 128 KiB on the wire for 64 KiB landed (2x; 1 -> 8: 512 KiB per decode rank for 64 KiB,
// 8x), while gathering sends the 64 KiB that land, 64 iovec entries of 512 bytes per page
// and decode rank. On one host the same chunks go by shared memory (see "Same-host
// pages"): decode gathers or scatters from the prefill mapping itself, in one copy. Prefill 4 -> decode 2 needs no choice: each 32 KiB prefill page goes
// whole to one decode rank, which scatters it into 64 rows of 512 bytes at its DstHead
// (the other half of each row is the other prefill rank's stream); 8 -> 1 likewise, 64 KiB
// in rows of 256 bytes.
//
// The receiver claims (page, slice) pairs: a chunk's slice must be one of its room's
// Copies for that buffer, exactly (an overlapping or foreign slice, or whole pages for a
// room of slices, fails the room invalid before a byte lands), each pair is claimed once,
// the crc32c covers the bytes sent, and the room is Complete only when every pair of every
// buffer landed. No byte of a destination row outside its expected slices is written, so
// the streams of several prefill ranks merge into one page.
//
// Each (prefill rank, decode rank) stream of slices is its own Key and Expectation: Key.Rank
// is the decode rank (whose region the receiver writes) and Key.From the prefill rank, so a
// decode rank fed by two prefill ranks (MHA 4 -> 2) expects two keys, each with its own
// sequence, totals, claimed pairs, RESULT and fence, and is done once both completed (the
// daemons count that; R11 per pair). The pair is in the key rather than in one Expectation
// taking several streams because everything keyed per stream (seq, DONE totals, the
// sender's job, the fence) then stays as it is; and the frames carry From in the header's
// bytes 30-31 (from_tp, from_size), the high half of the old 4-byte status, which only ever
// held a reason code below 16. A whole-page stream (equal TP, MLA) has From zero and its
// frames keep every byte they had; a build that does not know From refuses a frame with it
// (a status on a chunk or DONE), so it never lands a slice in another stream's room.
//
// Replicated heads (GQA with fewer KV heads than a side's ranks: tp/heads consecutive ranks
// hold one head) need no wire of their own. A decode rank whose row is one head that its
// source holds alone (2 heads, prefill 2 -> decode 4; 1 head, 1 -> 2) takes one Copy per
// buffer that is Whole from one prefill rank: rankmap's DecodeRank.WholePages, which both
// daemons ask, so the stream is a whole-page one (From zero, the same-host path open to it).
// Where a rank's row takes part of its source's (2 heads, 1 -> 4) or merges heads of
// several (2 heads, 4 -> 1) it is a sliced stream as above, from the lowest replica.
// Daemons that planned a room's streams apart would meet here as a DONE for a key the
// receiver never expected: refused as unknown_room (below), the sender answered fenced.
//
// # Refusals
//
// Every data frame the receiver refuses is counted by a closed Refusal (Receiver.Refused;
// decoded's pdlink_data_refused_total{reason}): unknown_room (a DONE for a key not
// expected: never, or no longer after its fence; logged at info with the keys expected
// for that room and decode rank instead), invalid (a chunk or DONE that does not match its
// room, which fails invalid), bad_frame (a header, frame type, run list or shm offer that
// fails its checks; the connection breaks) and checksum (a chunk's bytes or aux row that
// fail prefill's crc32c; the room fails checksum). Each is logged "data frame refused"
// with the room, the remote end and the error, one line per reason per second (the next
// says how many it stood for). The same-host path counts its refusals the same way: a shm
// chunk naming an offer never made or retired, source pages outside the offered buffer, a
// claim that fails (invalid), entries that do not decode (bad_frame), a copy that fails its
// crc32c (checksum). A prefill file found replaced or truncated at a chunk's stat is not a
// refusal: the frame was right, the file changed (region_replaced, transfer_error).
//
// Cost (BenchmarkSlicedTransfer, 64 MiB rooms of 32 KiB per page and buffer over loopback,
// median of 6 on the shared 2-core machine at load 6-7, so +-30%): whole pages 2.36 GB/s
// (receiver 0.22, sender 0.33 s CPU per GB); 2 -> 4 gathered 1.42 GB/s (0.60x; sender
// 0.54 s/GB, the writev of 512-byte rows); 4 -> 2 scattered 1.81 GB/s (0.77x; receiver
// 0.33 s/GB).
//
// # Ranks on the wire
//
// A Key names one tensor-parallel rank's share of a room: Room, Nonce and Rank{TP, Size}.
// Every data-plane key has its rank (Expect, Open, Send, Fence, the events), and every
// CHUNK, DONE and RESULT carries its whole key in the header (tp_rank, tp_size), so two
// ranks of one room are two streams end to end: a Sender takes several ranks of a room at
// once (each its own stream, seq and totals), and a Receiver with several ranks of a room
// expected writes each frame into the expectation of the rank it names only, so a rank is
// Complete with its own pages and aux row only (R11). Fencing or completing one rank does
// not touch another. A stream of head slices adds its prefill rank (Key.From, above).
//
// # Receiver (decode)
//
// The driver registers each room with Expect (destination runs per buffer, aux row) before
// its bytes may land. For every chunk the receiver checks the header and run-list
// checksums, that every run names a buffer of the layout and pages inside the region, among
// the room's destination pages and not already claimed (by an earlier chunk or earlier in
// this one), the sequence number and the byte count; only then does it read the payload
// into the destination pages, one piece (PieceBytes, across runs) at a time, updating the
// crc32c as it goes. Reads are buffered (32 KiB), so a small chunk and the frames after it
// take one read; payload bytes beyond what the buffering holds go straight into the pages,
// copied once. Chunks for unknown or ended rooms (a rank not expected included) are
// drained into a scratch buffer and counted, never written. Events.Complete is reported
// only when every page of every buffer and the aux row were written and verified and the
// DONE totals match (I8). Failures carry a Reason: "checksum", "transfer_error" or "invalid"
// ("region_replaced" on the same-host path, below).
//
// Fencing (R7): Fence(room) marks the room ended and returns at once; every later byte for
// the room is drained and discarded. Each room lists, under its mutex, the connection
// goroutines reading a piece into its pages; one joins only while the room is live. Fence
// reports done when the list is empty (I9: no byte can land any more). Otherwise the
// goroutine whose piece lands last calls ReceiverConfig.OnFenced; if that piece has not
// landed after FenceGrace, the fence sets that connection's read deadline to now, the read
// fails and the connection breaks (its other rooms fail transfer_error). FenceWait is the
// blocking form.
//
// # Sender (prefill)
//
// Per decode peer the Sender keeps ConnsPerPeer connections (default 2), each owned by a
// slot goroutine that dials with a deadline, serves the connection and redials with
// backoff. A room's transfer is a stream: Open registers it with its destination pages and
// pins it to the slot with the fewest open streams, so its chunks and DONE stay in order on
// one connection; each Append queues the next page positions of every buffer without
// waiting, and the Last piece, with the aux row, closes it. Pieces wait for the peer's
// in-flight budget (MaxInflightBytes), then for their slot's writer, each stream's in
// order; the budget admits a piece chunk by chunk (MaxChunkBytes units), not whole. Across
// streams, those whose last piece is appended go first, in the order they closed, then the
// others in append order (a room's end does not wait behind the rooms still being
// produced); the budget goes first to the slot holding the fewest admitted bytes, so every
// connection has work, and a slot's writer lets an open stream's piece wait, mid-piece,
// while a closing stream's admitted chunk is queued on its slot. So a closing stream's last
// chunk waits for one chunk's bytes to come back, not behind whole pieces of other rooms.
// Each chunk's bytes are given back as its write returns, not at the RESULT, so a stream
// larger than the budget never waits on its own earlier pieces. A stream's chunks carry one
// sequence across its pieces, and its DONE the stream's chunk and page totals, so the
// receiver's checks are the same for a room sent in one piece or many. Stream.Admitted
// reports, once, that the stream's last piece is admitted (the daemons answer the last
// Send from it); WaitAdmitted is the blocking form for the stream's pieces so far
// (backpressure), and Send is Open, one Last piece and WaitAdmitted. Every write has a deadline scaled by its size. Fence(room) stops any later
// read of the room's source pages, drops its queued pieces with their budget, ends a wait
// for admission (ErrFenced), refuses later Appends and returns at once: done when no worker
// reads the pages (I9), else the worker that lets go calls SenderConfig.OnFenced, and a
// write still in progress after FenceGrace has its deadline set to now, which breaks that
// connection (the slot redials). A room's Done callback runs only after its writer let go
// of it, and never once it was fenced. A broken connection fails the streams that wrote a
// chunk on it or await a result on it with transfer_error; a stream that wrote nothing yet
// goes out on the slot's next connection.
//
// # Fence contract (both sides)
//
// Fence never waits for I/O, so it may be called from a socket reader or a tick loop. When it
// returns false, OnFenced(key) follows exactly once, on the transfer goroutine that let go,
// under no transfer lock, within FenceGrace plus one piece (receiver) or one chunk write
// (sender); it is never called for a Fence that returned true. The fence is sticky: the room
// takes no more work, and its key stays taken (Open and Expect refuse it as a duplicate) until
// the fence is done.
//
// # Goroutines and ownership
//
//   - Receiver: Serve's goroutine accepts; each accepted connection has exactly one
//     goroutine, which reads it, writes its answers (RESULT, PONG) and is the only code that
//     writes region memory for the chunks it reads. Events and OnFenced are called from it.
//   - Sender: each connection slot goroutine is the only writer of its connection and the
//     only reader of source pages for the room it is sending, with a checksum goroutine
//     per room being written that reads the pages one or two chunks ahead; a second
//     goroutine per connection reads RESULT and PONG frames. Done callbacks run on either of
//     those, or on the goroutine that calls Close or RemovePeer; OnFenced on the slot or
//     checksum goroutine that let go; Admitted on the goroutine whose Append or chunk
//     write made room in the budget (the Append caller's when it had room).
//   - A Receiver's populate worker, at most one, only pre-faults accepted source
//     mappings (madvise) and unmaps the ones retired while it stepped through them; it
//     reads no byte and writes none.
//   - A pending fence's FenceGrace timer runs on its own goroutine; it only sets a deadline.
//   - Expect, Fence, FenceWait, Open, Append, WaitAdmitted, Send, AddPeer and RemovePeer
//     may be called from any goroutine; Fence, Open and Append never block on I/O. Append
//     the pieces of one stream from one caller at a time, in position order.
//
// # Same-host pages (--data-transport auto or shm)
//
// When prefilld and decoded share a host (a shared /dev/shm or a memory-backed volume),
// decoded copies each chunk's pages itself from the prefill rank's region, mapped
// read-only: one memory copy instead of two kernel copies through loopback, and decode
// stays the only writer of its memory, so the fence (R7, I9) is the TCP receiver's,
// unchanged (join a piece only while the room is live, copy it, leave).
//
// Negotiation is per data connection, after the Authenticator ran on it, never assumed.
// It is in the connection, not in REGISTER, because only the data connection is
// authenticated end to end and because the identity changes with the region's
// generation, which a connection can follow in order with the chunks it carries: before
// the first chunk of a stream whose source rank has no proven mapping on the connection
// (or a mapping of an older generation), the sender's writer sends a SHM_OFFER frame with
// the rank region's path, device, inode, generation and size, and waits for SHM_ANSWER,
// for SenderConfig.ShmOfferTimeout (1s) plus the file's size at 256 MiB/s: the writer
// holds every stream pinned to the connection meanwhile, so a decode that accepted the
// connection and never answers must cost less than a dial's 5s. The size term is for a
// decoded of the previous build, which answered only once it had mapped the file with
// MAP_POPULATE on the connection goroutine (BenchmarkShmOfferMap/prefault, 512 MiB of
// /dev/shm: 1.5-3.4 GB/s beside memcpy's 1.9-7.7 in the same run on the shared 2-core
// machine at load 9-10; a 40 GiB region took 13-29 s, and every room on the connection
// waited for it). This one answers in tens of microseconds whatever the size
// (BenchmarkShmOfferMap/answer: 512 MiB in a median 16 us, against 220 ms with
// MAP_POPULATE in the same runs), so the bound only matters against a hung or older peer.
// No answer in time breaks the connection (the room being written fails transfer_error)
// and the slot redials.
//
// decoded opens the path O_RDONLY, fstats the open file (device and inode must equal the
// offer's, size at least the layout's), maps it PROT_READ MAP_SHARED without
// pre-faulting, and only then answers "accepted" with the offer's id, all on the
// connection goroutine before it reads the next frame: no chunk can name an offer before
// it was proven, and a chunk naming an offer decode never accepted fails its room
// invalid. The Receiver's populate worker (at most one goroutine per Receiver, started
// when an offer is accepted, gone when nothing is left to pre-fault or at Close)
// pre-faults the accepted mappings' page tables with MADV_POPULATE_READ, 32 MiB a step,
// the queued mappings in turn. Chunks do not wait for it: one that arrives first copies
// from the proven mapping and faults its source pages in on first touch
// (BenchmarkShmFirstTouchCopy: 0.2-0.7x, median 0.45x, the rate of a copy from
// pre-faulted pages over 8 same-run rounds; each page once per mapping, the CPU the
// pre-fault would have spent, spent on the copy path). Waiting for the pre-fault would
// hold the connection again and falling back would copy every byte twice through the
// kernel, so the first rooms after an offer pay the faults instead. A file truncated
// under a step is an EFAULT from madvise, not a SIGBUS: the worker stops pre-faulting it
// (logged) and the room's chunk fails at its stat or in touchRegion as before. A mapping
// retired while a step runs on it is unmapped by the worker when the step ends, never
// under it; otherwise the connection goroutine unmaps it at once. Kernels without
// MADV_POPULATE_READ (before 5.14) leave every source to fault in on first copy. Any
// failure answers a fallback reason (disabled, open, identity, map) and the sender sends
// that rank's chunks with payload on the same connection, logged once per connection,
// rank and offer (a file is offered again only as a new generation or renewed, below)
// and counted (pdlink_shm_fallback_total{side,reason}). An accepted answer also says
// what decode copies besides whole pages (ShmCaps, in the answer's pages field): a decode
// of the build before head slices went by shared memory sends none and refuses a sliced
// shm chunk as a bad frame, so the sender sends a rank's sliced streams by tcp to it (its
// whole pages still by shm), logged once per connection and rank and counted as prefill's
// no_slices fallback. With --data-transport=shm a
// refused offer fails the stream instead (transfer_error, ErrShmRefused): a peer that
// cannot prove the file never runs over TCP. tcp never offers, and a tcp decoded declines
// every offer.
//
// A shm chunk (FlagShm) keeps the chunk's boundaries, its sequence number, its checksum
// and the DONE after the last one; its run list pairs each destination run with its
// source start and the offer id it reads from (ShmRun, 20 bytes) and it has no payload.
// Decode claims the destination pages exactly as for a TCP chunk, checks the source runs
// against the offered mapping's layout, stats the prefill file (Mapping.Check) before a
// byte is copied, then copies source -> destination one piece (PieceBytes) at a time,
// each inside touchRegion (a SIGBUS from a file truncated mid-copy fails that room with
// transfer_error, the daemon and the connection go on), updating the crc32c over each
// 32 KiB block of the destination right after its copy, while it is in the first-level
// cache. That crc is compared with the one prefill computed over its source pages when it
// announced the chunk (the same checksum goroutine as on TCP): a match proves the bytes
// now in decode's pages are the bytes prefill announced, so a prefill page reused or
// rewritten before decode copied it fails the room checksum rather than land as Success.
// With ReceiverConfig.CopyWorkers > 1 a chunk of at least that many pieces is split into
// contiguous parts on cache-line edges, each copied and summed by its own goroutine (each
// joins and leaves the room per piece, so a fence waits for all of them, and all end
// before COPIED); the parts' sums are combined in order (crc32cCombine) into the chunk's.
//
// Prefill's checksum pass stays on shm, on purpose. It is the only read of the source
// independent of decode's copy: decode's crc over the bytes it copied (or over the source
// as it reads it) compared with nothing but itself proves only that memmove works, while
// prefill's sum, taken before the chunk is announced, is what catches a page the engine
// rewrote before decode copied it and a source run mapped to the wrong pages. The
// identity proof and the fence say the file is the right one and that pdlink no longer
// reads it after terminal; they say nothing of the bytes. Running the pass after the
// announce instead (sum sent later) would keep its cost, since both sides are CPU-bound
// here, and shrink what it proves. Without it a shm room is --checksum none, which stays
// the operator's choice.
//
// A new generation of a prefill region (RegisterRegion of a replaced file) is a new offer
// on each connection before its next chunk; decode closes the old offer's mapping when the
// new one arrives (its connection goroutine is the only reader of it) and a chunk naming a
// retired offer id is refused (the room fails invalid): no byte is copied from a dead
// inode after prefill retired it. The per-chunk stat also catches a replacement between
// two offers: a file replaced at its path or removed fails the room region_replaced
// (ReasonRegionReplaced, RESULT code 5), the reason prefill gives when it notices the same
// event itself (RegisterRegion of the new file, its per-Send stat), so a replaced prefill
// file reads the same on both transports; a file truncated under the layout (the same
// inode, shorter) fails it transfer_error, as a fault mid-copy does. Either way decode
// unmaps that offer and keeps its id as gone: every later chunk prefill announced on it
// before it noticed fails with the same reason (a chunk naming an offer never made, or
// one retired by a newer offer, stays invalid).
//
// Neither a gone offer nor a refused one outlives the engine's next registration of the
// file. The same file registered again whole, with the same layout, is the same
// generation renewed (Mapping.Renew; the daemons' RegisterRegion calls it), and each
// connection's writer offers that rank's file again before its next chunk, whatever the
// last answer was: accepted (decode may since have found it truncated), or refused (an
// offer made while the file was short answers identity, and under auto the rank would
// stay on TCP for the connection's life). Decode retires the older offer as for a new
// generation and proves the file again (open, fstat, mmap: tens of microseconds, then
// the populate worker's pass over the new mapping in the background); the new answer
// holds until the next generation or registration. Each re-offer is counted
// (pdlink_shm_reoffers_total, prefill) and logged, once per connection and rank for each
// registration. Rooms that met the short file have failed already: a connection carries
// its frames in order, so every chunk announced on the gone offer reaches decode before
// the new offer and fails with the stat's reason, and later chunks of a failed room are
// discarded. Without a registration a gone offer stays gone: prefill is not told why
// decode failed a room, so the engine, which cut the file and put it back, is the one to
// say it is whole, by registering it.
//
// Budget: on TCP a chunk's bytes come back to the peer's in-flight budget when its write
// returns; a shm chunk's come back only at its COPIED frame, which decode sends for every
// shm chunk once it copied, refused or discarded it. So MaxInflightBytes still bounds what
// prefill announced and decode has not copied yet. Decode holds a COPIED back while the
// next frame is already in its read buffering and writes up to four in one write, always
// before a read that may wait for the sender (a write per chunk cost 11-16% of decode's
// CPU); COPIEDs held when the connection breaks never arrive, and prefill frees those
// chunks with the connection's others (below). Until then the chunk also holds its job
// as a reader of the source pages: prefill's Fence is done only when every announced chunk
// of the room was copied or refused, or (after FenceGrace) the connection was closed; a
// broken connection frees them at once, since decode copies at most the chunks whose
// frames it already read (bounded by the budget) and any of those whose pages changed
// since fails its checksum.
//
// A stream of head slices (Stream.Copies, MHA between TP sizes) goes by shared memory too.
// Its shm chunks carry both flags (FlagShm|FlagSliced) and each entry is a ShmSliceRun (40
// bytes: the TCP chunk's SliceRun, then the source start and the offer id). Decode claims
// the (page, slice) pairs exactly as for a TCP sliced chunk (claimSlices: the slice one of
// the room's Copies, each pair once, the page and byte totals, with the bytes the entries
// copy standing for the payload length), checks each entry's source pages against the
// offered buffer at the copy's source page size (PageTokens x SrcRow), stats the file, and
// only then copies: page by page and token by token, the slice's Heads x HeadBytes bytes
// from head SrcHead of the source row to head DstHead of the destination row. The source
// and destination pieces are walked apart, so the side whose slice is its whole row (the
// destination pages for prefill 2 -> decode 4, the source pages for 4 -> 2) is one piece
// per run and the other one row slice per token; a copy whole on both sides is one
// memmove per run. The fence (join per piece), touchRegion, COPIED and the budget are
// whole pages' (copyRange); the copy workers cut the chunk in the order below.
//
// Checksum order, both transports: a chunk's crc32c is over its bytes in TCP payload
// order, its entries in order, each entry's pages in order, each page's tokens in order,
// each token's slice bytes. Prefill's checksum goroutine sums exactly that on shm as on
// TCP (the gathered row iovec a TCP write would send), and decode sums each destination
// row slice right after copying it, so the two compare the same bytes in the same order
// whichever transport carried them: a page the engine rewrote before decode copied it, or
// an entry that reads the wrong heads, fails the room checksum. COPIED names the stream's
// From, so the hold of a stream of one of several prefill ranks (MHA 4 -> 2) is found.
// Only a decode whose answer carries ShmCapSlices gets them (the Same-host pages
// negotiation above); under --data-transport=shm a refused offer, or an answer without
// it, fails a sliced stream as a refused offer fails whole pages.
//
// Cost (BenchmarkShmSlicedTransfer beside BenchmarkSlicedTransfer and
// BenchmarkMemcpyReference, 64 MiB rooms of 32 KiB per page and buffer, medians of 3
// same-run rounds on the shared 2-core machine at load 7-9): memcpy 6.98 GB/s; whole
// pages shm 3.24 (tcp 1.27); 2 -> 4 shm 1.50 GB/s (tcp 0.78: 1.9x; 0.21x memcpy), decode
// 0.32-0.37 and prefill 0.31-0.36 CPU-s per GB (tcp 0.31-0.32 and 0.63-0.75: the writev of
// 512-byte rows is gone, decode now walks them); 4 -> 2 shm 1.55 GB/s (tcp 1.08: 1.4x;
// 0.22x memcpy), decode 0.22-0.29, prefill 0.14-0.22 (tcp 0.42-0.69 and 0.37-0.41).
// Both sides' CPU per GB, the steadier figure here: 2 -> 4 0.63-0.72 against tcp's
// 0.95-1.07, 4 -> 2 0.35-0.51 against 0.80-1.10. The sliced copies stay below whole pages
// (whole 0.15-0.16 per side): one memmove per 512-byte row, a crc32c call per row where
// the destination is the side cut into rows (4 -> 2), and prefill's checksum pass reads
// the rows one by one too (2 -> 4 reads half of each 1 KiB source row).
//
// Cost (BenchmarkShm_* beside BenchmarkMemcpyReference; same-run medians of 3 rounds on
// the shared 2-core machine at load 10-12, so GB/s follows the CPU share each process
// gets and swings 2x; CPU seconds per GB per side are the steadier figure). One thread's
// memcpy costs 0.06-0.08 s/GB (memcpy 3.5-9 GB/s wall); decode's copy and crc32c cost
// 0.15-0.22 s/GB, prefill's crc pass over cold source pages 0.13-0.15 s/GB on top of its
// 0.04-0.06. In a microbenchmark (CPU per GB, 64 MiB rotating over cold memory) Go's
// crc32c costs 0.04 s/GB from cache, a copy 0.06, a copy then crc of each block 0.10 with
// 16-64 KiB blocks, 0.12 with 256 KiB (the old piece-sized blocks) and 0.19 with 1 MiB
// (past the second-level cache): so one decode thread that copies and sums is bounded
// near 0.6x a memory copy before any protocol cost, and both sides together spend 0.3-0.4
// CPU-s per GB. And here the two daemons get about one core between them: at load 4-7,
// 1MiB crc32c ran 3.2 GB/s (0.31 s per GB) with decode 0.157 + prefill 0.161 CPU-s/GB,
// none 7.9 GB/s (0.127 s/GB) with 0.096 + 0.043, memcpy 14 GB/s at 0.055, so the ratio to
// memcpy is about the ratio of summed CPU per GB (0.2x and 0.5x), not a protocol stall.
// On 2 shared cores issue 14's 0.7x with crc32c on is out of reach; the 32
// KiB blocks' gain is within the transfer benchmark's noise, and a second copy worker
// gave none here (1MiB crc32c 1.82 GB/s with two, 2.69 with one, same run). Same run, before -> after (one worker): 1MiB crc32c
// 1.74 -> 2.69 GB/s, decode 0.165 -> 0.179 s/GB, prefill 0.181 -> 0.191; none 4.79 -> 5.90,
// decode 0.119 -> 0.105; 64KiBScattered crc32c 1.70 -> 2.03, decode 0.224 -> 0.206; none
// 3.35 -> 4.35: all within the machine's noise. pdctl bench, 100 requests, no model:
// shm 2.43 GB/s at 0.45 daemon s/GB, tcp 1.33 GB/s at 0.93 s/GB.
//
// Protocol costs cut since (same-run medians of 3 rounds, before -> after, CPU-s/GB prefill
// / decode, load 5-8): one stat per prefill file per chunk, not per run (it was a fifth of
// decode's CPU on 64 KiB scattered pages); COPIEDs grouped, up to four per write, and read
// buffered by prefill; prefill's crc pass block-wise with a touch-ahead (BenchmarkSumAhead
// over cold pages 0.10-0.13 -> 0.08-0.10). 1MiB crc32c 0.167/0.149 -> 0.121/0.137, none
// 0.040/0.089 -> 0.023/0.081; 64KiBScattered crc32c 0.178/0.179 -> 0.146/0.154, none
// 0.043/0.125 -> 0.034/0.109; pdctl bench shm (200 requests) both daemons 0.45 -> 0.40 s/GB,
// decoded 0.24 -> 0.20. What is left is mostly the bytes: decode's copy and sum from
// cache, prefill's sum over cold memory, and with --checksum none a copy in pieces below
// 1 MiB, which Go's memmove does with cached stores (1 MiB and up: non-temporal, 0.050
// against 0.062 s/GB in a microbenchmark).
//
// # Transports
//
// Transport (prefill side) and Sink (decode side) are the interfaces the daemons use. The
// TCP Sender and Receiver implement them over any stream connection: MemNetwork is the
// in-memory twin (net.Pipe, one copy from source to destination pages, Disconnect for
// partitions) used by the logic tests. The daemons build theirs with NewTransport and
// NewSink from a Kind (--data-transport: auto by default, tcp or shm; the Sender and
// Receiver serve all three, see "Same-host pages") and hold only the interfaces, so an RDMA
// engine is a new Kind with a case in each constructor: callers only use rooms, runs, Fence, ServeConn and the callbacks. Authenticator is the connection-preface hook (NoAuth by default) where an HMAC
// challenge-response will run before any frame.
//
// # Usage
//
// Decode (decoded):
//
//  1. OpenRegion the engine's file with its Layout at RegisterRegion; send the Layout in
//     REGISTER.
//  2. NewReceiver(region, ReceiverConfig{Checksum, ...}, events) and run Serve on the
//     --data-listen listener.
//  3. Expect each room (its METADATA: destination runs, aux row) before telling prefill to
//     send.
//  4. On Events.Complete report Success; on Events.Failed report Failed with the reason.
//  5. Call Fence(room) whenever the room ends for any reason (abort, timeout, clear); it
//     also forgets the room. The engine may reuse the room's pages once the fence is done:
//     Fence returned true, or OnFenced(room) arrived (or FenceWait returned).
//  6. Close the Receiver, then the Region.
//
// Prefill (prefilld):
//
//  1. OpenRegion the engine's file; NewSender(region, SenderConfig{ConnsPerPeer,
//     Checksum, ...}).
//  2. On REGISTER, AddPeer(data endpoint, peer layout); refuse the peer if it errors. On
//     peer loss or restart, RemovePeer.
//  3. Open each room's stream with its destination runs once decode's METADATA arrived,
//     Append its source pages as the engine produces them (the last piece with the aux
//     row), or Send it in one call. Done(nil) means decode confirmed every byte: report
//     Success. Done(err) carries a Reason: report Failed.
//  4. Before reporting a room Failed for any other cause (abort, timeout), call Fence(room);
//     Done will not run. No worker reads the room's pages once the fence is done: Fence
//     returned true, or OnFenced(room) arrived (or FenceWait returned). A Send or
//     WaitAdmitted of the room still waiting for admission returns ErrFenced.
//  5. Close the Sender, then the Region.
package transfer
