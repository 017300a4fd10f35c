// The one struct at the kernel boundary. Validation (validate.h) builds it from user input;
// kernels trust it completely and never throw.
//
// Every tensor is addressed by explicit element strides over the canonical 4-D index
// [b, h, row, col], so heads, grouped-query sharing, broadcast masks and column blocks of a
// wider matrix are all strides, never copies.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/dropout.h"
#include "qkv/tensor.h"

namespace qkv::core {

struct AttentionShape {
  std::int64_t b = 1;
  std::int64_t h = 1;    // query heads
  std::int64_t hkv = 1;  // key/value heads; h % hkv == 0
  std::int64_t nq = 0;
  std::int64_t nk = 0;
  std::int64_t d = 0;   // q and k head dimension
  std::int64_t dv = 0;  // v head dimension

  // Query heads per kv head: query head h reads kv head h / group(). 0 when there are no heads
  // (validation allows hkv == 0 only with h == 0).
  std::int64_t group() const noexcept { return hkv == 0 ? 0 : h / hkv; }
  // Query row i lines up with key row i + diagonal_offset() (bottom-right alignment).
  std::int64_t diagonal_offset() const noexcept { return nk - nq; }
};

struct Strides4 {
  std::int64_t b = 0, h = 0, row = 0, col = 0;

  std::int64_t at(std::int64_t ib, std::int64_t ih, std::int64_t irow,
                  std::int64_t icol) const noexcept {
    return ib * b + ih * h + irow * row + icol * col;
  }
};

struct InputOperand {
  const void* data = nullptr;
  DType dtype = DType::kF32;  // kF32, kF64, kBF16 or kF16
  Strides4 strides;           // h indexes this operand's own heads (hkv for K and V)
};

// data == nullptr: this output is not wanted.
struct OutputOperand {
  void* data = nullptr;
  DType dtype = DType::kF32;  // kF32 or kF64
  Strides4 strides;           // lse uses b, h and row only
};

struct Masking {
  bool causal = false;
  std::int64_t window_left = -1;    // -1: unbounded
  std::int64_t window_right = -1;   // -1: unbounded
  const void* mask = nullptr;       // nullptr: no explicit mask
  DType mask_dtype = DType::kBool;  // kBool (true = allowed) or kF32/kF64 (additive)
  Strides4 mask_strides;            // broadcast dims have stride 0; h indexes query heads
  // Position offsets for a call that is one block of a longer sequence (the ring, src/dist):
  // causal, window and ALiBi see query row i at position q_offset + i and key row j at
  // k_offset + j, so the diagonal moves by q_offset - k_offset (diagonal_offset below). Both 0:
  // the call's own bottom-right alignment. The fused forward kernels and the reference honour
  // them, and every backward kernel; src/dist runs no other kernel with them set.
  std::int64_t q_offset = 0;
  std::int64_t k_offset = 0;

  bool has_structure() const noexcept { return causal || window_left >= 0 || window_right >= 0; }
};

// Query row i lines up with key row i + diagonal_offset(s, m): the shape's bottom-right
// alignment moved by the masking's position offsets.
inline std::int64_t diagonal_offset(const AttentionShape& s, const Masking& m) noexcept {
  return s.diagonal_offset() + m.q_offset - m.k_offset;
}

// What the softmax sees beyond scale · q·k and the mask (attention.h):
//   s_ij = softcap(scale · q_i·k_j) + alibi_ij + float mask_ij, and the sinks' extra logits.
// The vectors are empty when the call has none, else have one entry per query head.
struct ScoreModifiers {
  double softcap = 0.0;              // > 0: softcap(x) = softcap · tanh(x / softcap); 0: none
  std::vector<double> alibi_slopes;  // alibi_ij = -slope_h · |i + nk - nq - j|
  std::vector<double> sinks;         // exp(sink_h) joins each row's denominator

  bool any() const noexcept { return softcap > 0.0 || !alibi_slopes.empty() || !sinks.empty(); }
};

// A bound on the magnitude of each input's elements (all finite: validation has checked), from
// the finiteness scan: the largest magnitude where some element reaches 2^32, else 2^32 (see
// require_finite). The float32 kernels bound their scores and accumulators with them.
struct Magnitudes {
  double q = 0, k = 0, v = 0;
  double mask = 0;  // of a float mask's finite values; 0 for a bool mask or none
  double sink = 0;  // of the sinks; 0 without
};

// What a kernel reports. Kernels never throw; the one thing they cannot rule out in advance
// is that their workspace cannot be allocated, which the entry point turns into a qkv::Error.
enum class KernelStatus { kOk, kOutOfMemory };

class Progress;  // core/progress.h

struct AttentionParams {
  AttentionShape shape;
  InputOperand q, k, v;
  double scale = 1.0;
  // The storage type Q, K and V are rounded to as they are read (kF64, kF32, kBF16, kF16):
  // kF32 leaves float32 (and 16-bit) inputs as they are; a kernel that computes in float32
  // declines kF64.
  DType compute = DType::kF32;
  ScoreModifiers modifiers;
  Magnitudes magnitudes;
  Masking masking;
  // Dropout on the weights (core/dropout.h); inactive unless options.dropout_p > 0. Kernels
  // that cannot draw it decline (the fused forward kernels, the reference and every backward
  // kernel draw it).
  Dropout dropout;
  OutputOperand out;      // [b, h, nq, dv]
  OutputOperand weights;  // [b, h, nq, nk]
  OutputOperand lse;      // [b, h, nq]
  int threads = 1;        // exactly this many threads, >= 1
  // Where kernels report finished query rows (core::report_rows); nullptr: nobody listens.
  Progress* progress = nullptr;
  // Non-null when validation left K and V unscanned (validate_attention's defer_kv_scan) and
  // the kernel reads every element of both (attention_fwd_decode_hwy): the kernel sets it when
  // an element it read is a NaN, an infinity or of magnitude 2^32 or more, which the bounds in
  // `magnitudes` assumed away; the entry point then scans, and refuses or reruns.
  std::atomic<bool>* kv_unchecked = nullptr;
};

}  // namespace qkv::core
