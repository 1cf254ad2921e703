// Package rankmap maps prefill tensor-parallel ranks onto decode tensor-parallel ranks, in
// one place, as SGLang resolves them. It is pure: no sockets, no clock, no goroutines; a
// Mapping is a value computed from two Topologies and read by anyone.
//
// # Who calls it
//
// pkg/transfer's PlanRanks, for two described layouts, which the prefill room owner calls
// once per pair of layouts (a decode peer's from REGISTER and its own; again when either
// changes): Plan(prefill, decode) either refuses the pair with a sentinel from errors.go
// (the peer is then not usable for rooms) or returns the Mapping every room between the two
// engines uses, kept per peer. Nothing here is per room.
//
// # The mapping
//
// Each rank of a side holds, per KV buffer, pages of PageTokens token rows; a row is the
// rank's RankHeads heads of HeadBytes bytes (SGLang's layout: page p of buffer i at
// ptr[i] + p*item_len, token-major, head-major within a token).
//
//	prefill TP vs decode TP   decode rank d addresses (Targets)   fed by (From)           responses
//	equal                     prefill d                           prefill d, whole pages  1
//	decode larger (ratio q)   prefill d/q                         that rank, its heads    1
//	prefill larger (ratio r)  prefill d*r .. d*r+r-1              MHA: each holder of     r, fewer when
//	                                                              distinct heads          heads replicate
//	                                                              MLA: d*r alone          1
//
// MHA with different TP moves head slices: within a page, one run per token of
// Heads*HeadBytes bytes, from token*SrcRow + SrcHead*HeadBytes to token*DstRow +
// DstHead*HeadBytes (SGLang's send_kvcache_slice). When total heads < TP, tp/total
// consecutive ranks hold the same head; Plan reads each head from the lowest replica among
// the targets and the other replicas become dummies for that decode rank (SGLang writes the
// identical bytes from every replica). A decode rank whose row is one replicated head its
// source holds alone (2 heads, 2 -> 4 or 4 -> 2) gets Whole copies from that one rank
// (DecodeRank.WholePages): both daemons then move it as whole pages, as for MLA. MLA never
// slices: the latent is whole on every rank, so a decode rank reads whole pages from its
// first target and the others are dummies.
// Equal TP is the identity (Mapping.Identity, Copy.Whole): one whole-page copy per buffer,
// so the caller keeps its fast path.
//
// Completion: a decode rank is Success when every rank in its From delivered its copies,
// and the aux row (written by AuxFrom alone) is in place; Dummies are never waited for. A
// prefill rank waits for Addressed() METADATA frames (SGLang's required_dst_info_num),
// sends to To, and answers Dummies without sending.
//
// # Refusals
//
// Plan refuses, naming side, buffer and numbers: TP outside 1..MaxTP or TP sizes that do
// not divide; zero, negative or oversized sizes; MLA on one side only; different buffer
// counts, page sizes, bytes per head (dtype), total heads or aux rows; heads that do not
// divide TP; heads per rank that TP does not imply.
//
// # Cost
//
// Measured on the shared 2-core machine under load (x_plain = sliced time over a plain copy
// of the same bytes between the same buffers, median of 6, in-cache pages):
//
//	BenchmarkApply2to4           1 MiB pages, 1024 runs of 512 B   x_plain ~1.0 (0.86-1.45)
//	BenchmarkApply1to8SmallRuns  1 MiB pages, 1024 runs of 128 B   x_plain ~1.4 (1.2-1.7)
//	BenchmarkPlan                8 -> 1, 160 buffers               ~110 us per Plan
//
// So slicing costs little in memory; what costs is the run count (PageTokens per page per
// copy) if each run became its own write or syscall: gather runs into one frame instead.
package rankmap
