// The ISA-independent half of the decode kernels: what one call reads (plain K/V tensors or a
// KV cache's pages), how its keys are split into chunks, and the per-thread scratch. The chunk
// loop itself is per target (attention_fwd_decode_hwy.cc, attention_fwd_decode_scalar.cc); the
// driver that runs the chunks and merges them is decode_driver.cc. The algorithm is worked
// through in attention_fwd_decode_hwy.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/page_layout.h"
#include "core/params.h"

namespace qkv::kernels::decode {

// How K and V are stored; the kernels widen them to float32 in registers.
enum class KVType : std::uint8_t { kF32, kBF16, kF16, kInt8, kF64 };

// Keys per chunk: at least kMinChunkKeys (so that a chunk's partial state is worth merging) and
// few enough that a (batch, kv head) has at most kMaxChunks; chosen from the shape only, never
// the thread count, so the merge order and hence the bits are the same on any thread count.
constexpr std::int64_t kMinChunkKeys = 1024;
constexpr std::int64_t kMaxChunks = 64;
// Keys per block: one vector of scores per row on AVX-512, converted K/V rows stay in L1.
constexpr std::int64_t kBlockKeys = 16;
// Rows are padded to a whole number of vectors of the widest target.
constexpr std::int64_t kPadLanes = 16;
// Plain-tensor calls with more query rows per kv head than this go to the fused kernel, whose
// tiles reuse each K/V element for many rows; at this many or fewer, per-call packing costs
// more than it saves.
constexpr std::int64_t kMaxPlainRows = 16;

inline std::int64_t round_up(std::int64_t n, std::int64_t m) noexcept {
  return (n + m - 1) / m * m;
}

inline std::int64_t chunk_keys(std::int64_t nk) noexcept {
  const std::int64_t spread = round_up((nk + kMaxChunks - 1) / kMaxChunks, kMinChunkKeys);
  return spread > kMinChunkKeys ? spread : kMinChunkKeys;
}

// A run of consecutive keys of one (batch, kv head): row r of K starts at k + r · k_row
// elements (of the storage type), its elements k_col apart (1 for pages), its int8 scales at
// k_scales + r · k_scale_row.
struct KVRun {
  const void* k = nullptr;
  const void* v = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  std::int64_t k_row = 0, v_row = 0;
  std::int64_t k_col = 1, v_col = 1;
  std::int64_t k_scale_row = 0, v_scale_row = 0;
  std::int64_t rows = 0;
};

// One decode call. Batch entry b has nk[b] keys; key j of (b, kv head hk) is row j of the plain
// K/V tensors, or row first_row + j of sequence b's pages.
struct DecodeCall {
  std::int64_t b = 0, h = 0, hkv = 1, nq = 0, d = 0, dv = 0;
  KVType k_type = KVType::kF32;  // plain tensors may mix types; pages share one
  KVType v_type = KVType::kF32;
  core::InputOperand q;
  // Plain tensors (pages empty): K and V as validation described them, column stride 1.
  core::InputOperand k, v;
  // A cache: its layout and one snapshot per batch entry.
  const cache::PageLayout* layout = nullptr;
  std::vector<cache::SequenceSnapshot> sequences;
  std::vector<std::int64_t> nk;  // per batch entry
  double scale = 1.0;
  core::ScoreModifiers modifiers;  // softcap, ALiBi, sinks
  core::Masking masking;           // an explicit mask only for plain tensors
  core::OutputOperand out, lse;
  core::OutputOperand weights;  // plain tensors only
  int threads = 1;
  core::Progress* progress = nullptr;  // told each (b, kv head)'s rows once they are merged
  // Plain tensors left unscanned (AttentionParams::kv_unchecked): set when an element of K or V
  // read is not finite or reaches 2^32 in magnitude. Only the SIMD kernel is given one.
  std::atomic<bool>* kv_unchecked = nullptr;

  std::int64_t group() const noexcept { return hkv == 0 ? 0 : h / hkv; }
  std::int64_t rows() const noexcept { return group() * nq; }  // query rows per task

  // The longest run of keys of (b, hk) starting at key j (j < nk[b]).
  KVRun run_at(std::int64_t ib, std::int64_t hk, std::int64_t j) const noexcept;
};

inline std::int64_t storage_bytes(KVType type) noexcept {
  switch (type) {
    case KVType::kF32:
      return 4;
    case KVType::kBF16:
    case KVType::kF16:
      return 2;
    case KVType::kInt8:
      return 1;
    case KVType::kF64:
      return 8;
  }
  return 4;
}

// One task: the rows of every query head of kv head hk of batch entry b against keys [j0, j1).
struct Task {
  std::int64_t b = 0, hk = 0, j0 = 0, j1 = 0;
};

// A task's result: per row the softmax state against its keys and the unnormalised output
// sum_j exp(s_j - m) v_j. Row r is query head hk·g + r / nq, query row r % nq.
struct Partial {
  float* o = nullptr;  // rows x dvp
  float* m = nullptr;  // rows
  float* l = nullptr;  // rows
};

// A worker's scratch, rows padded to kPadLanes: Q rows (converted, zero-padded), the block's K
// and V rows when they cannot be read in place, the block's scores.
struct Scratch {
  std::int64_t* ranges = nullptr;  // 2 x rows: each row's first and one-past-last key
  float* q = nullptr;              // rows x dp
  float* k = nullptr;              // kBlockKeys x dp
  float* v = nullptr;              // kBlockKeys x dvp
  float* s = nullptr;              // rows x kBlockKeys
  float* alpha = nullptr;          // rows: each row's rescale factor for the block
};

// The per-target chunk loop. With finals == nullptr it fills `out` for `task`; else finals
// holds each row's merged (max, 1 / sum) (2 x rows floats of the task's (b, kv head)) and it
// writes the task's keys' weights exp(s - max) / sum, recomputing the scores exactly as before.
using ChunkFn = void (*)(const DecodeCall& call, const Task& task, const Scratch& scratch,
                         const Partial& out, const float* finals) noexcept;

// Runs every task on call.threads threads, merges each row's chunks in key order and writes
// out and lse. kOutOfMemory when the partials or the scratch cannot be allocated.
core::KernelStatus run_decode(const DecodeCall& call, ChunkFn chunk) noexcept;

// The bytes run_decode allocates for this call on `threads` threads (saturating), and the same
// from the sizes: query rows per task, head dims, tasks.
std::uint64_t decode_workspace_bytes(const DecodeCall& call, int threads) noexcept;
std::uint64_t workspace_bytes(std::int64_t rows, std::int64_t d, std::int64_t dv,
                              std::int64_t tasks, int threads) noexcept;

// The kernels' run functions for a DecodeCall (the SIMD one absent from a portable build).
core::KernelStatus decode_run_hwy(const DecodeCall& call) noexcept;
core::KernelStatus decode_run_scalar(const DecodeCall& call) noexcept;

// Why the decode kernels decline plain-tensor params (empty: they take them); why the default
// choice passes them by for another kernel (empty: they suit the shape); the call they run.
std::string plain_declines(const core::AttentionParams& p);
std::string plain_passes(const core::AttentionParams& p);
DecodeCall plain_call(const core::AttentionParams& p) noexcept;

}  // namespace qkv::kernels::decode
