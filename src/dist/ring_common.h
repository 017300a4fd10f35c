// What the ring's forward (ring_attention.cc) and backward (ring_backward.cc) share: the
// checks every rank agrees on before the first step, the block geometry and the masking's
// position offsets of one (query range, key range) pair. src/dist only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "core/params.h"
#include "qkv/attention.h"
#include "qkv/dist.h"
#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv::dist::detail {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline std::string problem_of(const std::exception& e) { return e.what(); }

inline std::int64_t align64(std::int64_t bytes) { return (bytes + 63) / 64 * 64; }

// A mask for this rank's query rows and all nk keys ([.., nq_local, nk] after broadcasting),
// checked as attention() checks one: by validating the call against K and V of nk rows that
// read nothing (zero strides over one zero element), whose mask settings `base` then takes.
void apply_mask(const TensorView& q, const TensorView& k, const TensorView& v,
                const AttentionOptions& options, std::int64_t nk, core::AttentionParams& base);

// Collective: the whole problem's rows of Q and of K/V (the sums over the ranks), after every
// rank has checked its Q, K and V against rank 0's (rank, heads, head dims, dtypes, compute
// type) and its rows against the layout. Every problem found is agreed (agree()), so every
// rank throws the same AgreedError.
std::array<std::int64_t, 2> agree_on_shapes(const TensorView& q, const TensorView& k,
                                            const TensorView& v, const core::AttentionParams& p,
                                            const Communicator& comm, RowLayout layout);

// The options every rank must call the ring with alike (agree_on_settings), named as
// AttentionOptions' fields: each that changes what is computed or returned, as validated into
// `p` (the scale and ALiBi slopes resolved), the mask's dtype and shape but for its query-row
// axis (each rank holds its own rows), and the row layout. `forward`: return_lse too.
std::vector<Setting> ring_settings(const AttentionOptions& options, const core::AttentionParams& p,
                                   RowLayout layout, bool forward);

// A float64 copy of Q, K or V for a call whose float32 kernels decline its range (scores or
// gradient sums beyond float32's): rounded to float32 first, as the float32 call would have
// read it, so that only the arithmetic widens. The ring then runs that call in float64 on
// every rank (each rank makes the same choice from the agreed magnitudes and shapes), where one
// process would run the reference kernel.
Tensor widened_input(const TensorView& t);

// Whether any query of global rows [q.first, q.last) may see any key of [k.first, k.last)
// (the diagonal of query i is key i + nk - nq, bottom-right alignment).
bool visible(const core::Masking& m, std::int64_t nq, std::int64_t nk, const RowRange& q,
             const RowRange& k);

// The masking's position offsets for a call on query rows q and key rows k of the whole
// problem (nq, nk): causal, window and ALiBi then see global positions.
inline void set_offsets(core::Masking& m, std::int64_t nq, std::int64_t nk, const RowRange& q,
                        const RowRange& k) {
  // The call's own alignment (k.size() - q.size()) taken back, the whole problem's put in.
  m.q_offset = q.first + (nk - nq) - (k.size() - q.size());
  m.k_offset = k.first;
}

// A K/V block as it travels: K [b, hkv, rows, d] then V [b, hkv, rows, dv] at the next 64-byte
// boundary, rows contiguous, each in its storage type.
struct BlockGeometry {
  std::int64_t b = 1, hkv = 1, d = 0, dv = 0;
  std::int64_t k_elem = 4, v_elem = 4;

  std::int64_t k_bytes(std::int64_t rows) const { return b * hkv * rows * d * k_elem; }
  std::int64_t v_at(std::int64_t rows) const { return align64(k_bytes(rows)); }
  std::int64_t bytes(std::int64_t rows) const { return v_at(rows) + b * hkv * rows * dv * v_elem; }
};

// This rank's K and V into `at` (geometry.bytes(rows) bytes), the padding zeroed so that no
// uninitialised byte is sent.
void pack_block(const BlockGeometry& g, const TensorView& k, const TensorView& v, char* at);

// K and V operands for key rows [first, first + ...) of a block of `rows` rows at `block`.
void point_at_block(const BlockGeometry& g, const char* block, std::int64_t rows,
                    std::int64_t first, core::InputOperand& k, core::InputOperand& v);

// The ring's choice among `kernels` (list order): those `eligible` admits, only `requested`
// when one is named (an Error when it declines the call or is not in this build). Returns the
// first that accepts `params`, else nullptr with `last` the last eligible one: the forward ring
// then runs the reference, the backward ring refuses.
template <class Kernel, class Params, class Eligible>
const Kernel* first_accepting(std::span<const Kernel> kernels, const Params& params,
                              const std::string& requested, Eligible&& eligible,
                              const Kernel*& last) {
  last = nullptr;
  for (const Kernel& kernel : kernels) {
    if (!eligible(kernel.name)) continue;
    if (!requested.empty() && kernel.name != requested) continue;
    last = &kernel;
    const std::string reason = kernel.declines(params);
    if (reason.empty()) return &kernel;
    if (!requested.empty()) throw Error("kernel " + requested, "cannot run this call: " + reason);
  }
  if (last == nullptr) throw Error("kernel " + requested, "no such kernel in this build");
  return nullptr;
}

}  // namespace qkv::dist::detail
