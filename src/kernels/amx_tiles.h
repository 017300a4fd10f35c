// bf16 products on AMX tiles (Intel Sapphire Rapids and later): the matrix unit the bf16
// backward's products run on where the CPU has it (bwd_amx-inl.h). One operation,
//
//   C (m x n floats) (+)= A·B,   A(r, x) and B(x, col) 32-bit words holding bf16 pairs,
//   C(r, col) += a_lo·b_lo + a_hi·b_hi summed over the k2 pairs x,
//
// the layout tdpbf16ps reads: A row-major in pairs along the reduction index, B "VNNI" (row x
// of B holds pair x of every column). Products of two bf16 values are exact in float32; the
// sums are float32 in an order the hardware fixes (the same for any thread count: a tile's
// product never depends on how the work was split). tdpbf16ps reads subnormal bf16 operands as
// zero and flushes subnormal results to zero, as vdpbf16ps reads its operands.
//
// amx_gemm_bf16_reference is the twin: the same sums in a plain loop, pair by pair.
#pragma once

#include <cstdint>

namespace qkv::kernels {

// Rows of a tile, and bf16 pairs (32-bit words) in a tile's row: the reduction of every
// amx_gemm_bf16 call runs in whole tiles of kAmxTile pairs.
constexpr std::int64_t kAmxTile = 16;
constexpr std::int64_t amx_whole_tiles(std::int64_t n) noexcept {
  return (n + kAmxTile - 1) / kAmxTile * kAmxTile;
}
// Whether the forward's packed Q rows and K^T tiles (d/2 pairs, no padding) are whole tiles.
constexpr bool amx_forward_head_dim(std::int64_t d) noexcept { return d % (2 * kAmxTile) == 0; }
// bf16 pairs packed as 16-bit halves, read as the 32-bit words amx_gemm_bf16 takes.
inline const std::uint32_t* amx_words(const std::uint16_t* pairs) noexcept {
  return reinterpret_cast<const std::uint32_t*>(pairs);
}

// The CPU has AMX tiles with bf16 (amx-tile and amx-bf16). Read once.
bool cpu_has_amx_bf16() noexcept;

// The kernels' choice: the CPU has AMX bf16, Linux granted this process the tile state
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked once, on the first call: like oneDNN's, the request
// makes the process's signal frames about 8 KiB larger), the build compiled the path (GCC on
// x86-64), and QKV_BF16_AMX is not 0. QKV_BF16_AMX=0 keeps the process away from AMX: bf16
// calls take the next path (bf16_dots_supported() or the widened float32 one).
bool amx_bf16_supported() noexcept;

// While alive, this thread's tiles are configured for amx_gemm_bf16 (every tile 16 rows of 64
// bytes); the destructor releases them. Products objects hold one: built, used and destroyed
// on one worker thread, with no other code of the caller's running on it in between.
class AmxTileSession {
 public:
  AmxTileSession() noexcept;
  ~AmxTileSession();
  AmxTileSession(const AmxTileSession&) = delete;
  AmxTileSession& operator=(const AmxTileSession&) = delete;
};

// C (ldc floats a row) rows [0, m), columns [0, n): C = A·B, or C += A·B with `accumulate`.
// A(r, x) is the word at a + r·lda + x (words), B(x, col) the word at b + x·ldb + col.
// Requirements the callers' packing meets: n and k2 whole multiples of 16 (zero words pad the
// reduction); A readable for m rounded up to 16 rows (rows past m feed nothing written); C
// writable for rows [0, m) only. Needs an AmxTileSession alive on this thread.
void amx_gemm_bf16(std::int64_t m, std::int64_t n, std::int64_t k2, const std::uint32_t* a,
                   std::int64_t lda, const std::uint32_t* b, std::int64_t ldb, float* c,
                   std::int64_t ldc, bool accumulate) noexcept;

// The twin, from the definition: for each (r, col), x = 0, 1, ...: c += a_lo·b_lo + a_hi·b_hi
// in float32 (no subnormal flushing). Any n and k2.
void amx_gemm_bf16_reference(std::int64_t m, std::int64_t n, std::int64_t k2,
                             const std::uint32_t* a, std::int64_t lda, const std::uint32_t* b,
                             std::int64_t ldb, float* c, std::int64_t ldc,
                             bool accumulate) noexcept;

}  // namespace qkv::kernels
