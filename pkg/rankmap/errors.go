package rankmap

import "errors"

// Sentinel errors returned by Plan. Every refusal wraps exactly one of them, with the side,
// buffer and numbers that failed; the service edge maps them to a gRPC code.
var (
	// ErrInvalidTP: a side's tensor-parallel size is below 1 or above MaxTP.
	ErrInvalidTP = errors.New("rankmap: invalid tp size")
	// ErrTPNotDivisible: neither TP size divides the other, so ranks cannot be grouped as SGLang groups them.
	ErrTPNotDivisible = errors.New("rankmap: tp sizes do not divide")
	// ErrInvalidSize: a page size, head count, head byte count or aux row length is zero, negative or too large.
	ErrInvalidSize = errors.New("rankmap: invalid size")
	// ErrUnknownAttention: a side's Attention is neither MHA nor MLA.
	ErrUnknownAttention = errors.New("rankmap: unknown attention kind")
	// ErrMixedAttention: one side is MLA (replicated latent) and the other MHA (split heads).
	ErrMixedAttention = errors.New("rankmap: mla on one side only")
	// ErrBufferCountMismatch: the sides have different numbers of KV buffers, or a side has none or too many.
	ErrBufferCountMismatch = errors.New("rankmap: buffer count mismatch")
	// ErrPageSizeMismatch: a buffer's page holds a different number of tokens on each side.
	ErrPageSizeMismatch = errors.New("rankmap: page size mismatch")
	// ErrDtypeMismatch: a buffer's bytes per head per token (head_dim x dtype bytes) differ between the sides.
	ErrDtypeMismatch = errors.New("rankmap: bytes per head mismatch")
	// ErrHeadCountMismatch: a buffer's total KV head count differs between the sides.
	ErrHeadCountMismatch = errors.New("rankmap: total kv head count mismatch")
	// ErrHeadsNotDivisible: a buffer's total KV heads and the side's TP size do not divide one another.
	ErrHeadsNotDivisible = errors.New("rankmap: kv heads and tp size do not divide")
	// ErrRankHeadsMismatch: the heads a rank holds are not what its TP size implies (max(total/tp, 1) for MHA, total for MLA).
	ErrRankHeadsMismatch = errors.New("rankmap: kv heads per rank do not match total and tp")
	// ErrAuxRowMismatch: the aux row length differs between the sides.
	ErrAuxRowMismatch = errors.New("rankmap: aux row length mismatch")
	// ErrUncovered: a decode head is held by none of the prefill ranks addressed for it; validation should make this unreachable.
	ErrUncovered = errors.New("rankmap: decode head not held by any addressed prefill rank")
)
