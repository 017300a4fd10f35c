// qkv::attention_cached: the public entry for attention against a KV cache. It checks the call
// (the only place that does: the decode kernels trust the DecodeCall), takes one snapshot of
// each sequence, and runs the decode kernel on the pages in place; the reference instead
// gathers each sequence's rows, dequantised exactly, and computes in float64.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "cache/kv_cache_impl.h"
#include "core/floating_point.h"
#include "core/mask_rule.h"
#include "core/memory_budget.h"
#include "core/parallel_for.h"
#include "core/validate.h"
#include "kernels/decode_common.h"
#include "kernels/kernel.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"

namespace qkv {
namespace {

std::string sequence_subject(SequenceId id) { return "sequence " + std::to_string(id); }

kernels::decode::KVType kv_type(CacheStorage storage) noexcept {
  switch (storage) {
    case CacheStorage::kF32: return kernels::decode::KVType::kF32;
    case CacheStorage::kBF16: return kernels::decode::KVType::kBF16;
    case CacheStorage::kF16: return kernels::decode::KVType::kF16;
    case CacheStorage::kInt8: return kernels::decode::KVType::kInt8;
  }
  return kernels::decode::KVType::kF32;
}

// Sequence s's part of a [S, ...] view (the view itself when rank4 is false: one sequence):
// `per_sequence` elements further on, without the first dim.
template <class View>
View sequence_slice(View view, std::size_t s, std::int64_t per_sequence, bool rank4) {
  if (!rank4) return view;
  using Byte = std::conditional_t<std::is_same_v<View, TensorView>, const std::byte, std::byte>;
  view.data = static_cast<Byte*>(view.data) + static_cast<std::int64_t>(s) * per_sequence *
                                                  static_cast<std::int64_t>(dtype_size(view.dtype));
  view.shape.erase(view.shape.begin());
  view.strides.erase(view.strides.begin());
  return view;
}

// The reference twin: each sequence's gathered rows through the float64 reference kernel,
// written into that sequence's slice of the outputs.
void run_reference(const TensorView& q, const KVCache& cache,
                   std::span<const SequenceId> sequences, const AttentionOptions& options,
                   AttentionResult& result, bool rank4) {
  AttentionOptions per = options;
  per.kernel = "reference";
  per.return_lse = false;
  per.max_memory = 0;  // the whole call's budget was checked
  const auto count = static_cast<std::int64_t>(sequences.size());
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    const Tensor k = cache.gather(sequences[s], false, DType::kF64);
    const Tensor v = cache.gather(sequences[s], true, DType::kF64);
    AttentionOutputs outputs{
        sequence_slice(result.out.mutable_view(), s, result.out.numel() / count, rank4),
        std::nullopt, std::nullopt};
    if (!result.lse.empty()) {
      outputs.lse = sequence_slice(result.lse.mutable_view(), s, result.lse.numel() / count, rank4);
    }
    attention_into(sequence_slice(q, s, rank4 ? q.strides[0] : 0, rank4), k.view(), v.view(),
                   per, outputs);
  }
}

}  // namespace

AttentionResult attention_cached(const TensorView& q, const KVCache& cache,
                                 std::span<const SequenceId> sequences,
                                 const AttentionOptions& options) {
  const core::FloatingPointScope floating_point;  // the default environment (floating_point.h)
  const KVCache::Impl& impl = cache.impl();
  const KVCacheOptions& co = impl.options;
  const auto count = static_cast<std::int64_t>(sequences.size());
  const std::string q_name = q.name.empty() ? "q" : q.name;

  if (q.dtype != DType::kF32 && q.dtype != DType::kF64 && q.dtype != DType::kBF16 &&
      q.dtype != DType::kF16) {
    throw Error(q_name, std::string("dtype ") + dtype_name(q.dtype) +
                            " is not supported (float32, float64, bfloat16 or float16)");
  }
  const bool rank4 = q.rank() == 4;
  if (!rank4 && q.rank() != 3) {
    throw Error(q_name, "expected [S, H, Nq, D] (or [H, Nq, D] for one sequence), got " +
                            shape_string(q.shape));
  }
  if (!rank4 && count != 1) {
    throw Error(q_name, "[H, Nq, D] serves one sequence; " + std::to_string(count) +
                            " were given (use [S, H, Nq, D])");
  }
  if (rank4 && q.dim(0) != count) {
    throw Error(q_name, "its first dim S = " + std::to_string(q.dim(0)) + " must equal the " +
                            std::to_string(count) + " sequences given");
  }
  const std::int64_t h = q.dim(-3), nq = q.dim(-2), d = q.dim(-1);
  if (d != co.d) {
    throw Error(q_name, "head dimension D = " + std::to_string(d) + " does not match the cache's D = " +
                            std::to_string(co.d));
  }
  if (h % co.kv_heads != 0) {
    throw Error(q_name, "H = " + std::to_string(h) + " query heads is not a multiple of the cache's Hkv = " +
                            std::to_string(co.kv_heads));
  }
  if (options.mask) {
    throw Error("mask", "not supported with a KV cache (its key dimension differs between "
                        "sequences); use causal and window");
  }
  if (options.return_weights) {
    throw Error("return_weights", "not supported with a KV cache (the key dimension differs "
                                  "between sequences)");
  }
  if (options.out_dtype != DType::kF32 && options.out_dtype != DType::kF64) {
    throw Error("out_dtype", "must be float32 or float64");
  }
  // The cache fixes the storage type of K and V; packed batches are the cache's sequences.
  if (options.dtype) {
    throw Error("dtype", "not supported with a KV cache (its pages fix the storage type of K "
                         "and V)");
  }
  if (options.cu_seqlens_q || options.cu_seqlens_k) {
    throw Error("cu_seqlens", "not supported with a KV cache (give the cache's sequences "
                              "instead)");
  }
  if (options.dropout_p != 0.0) {
    throw Error("dropout_p", "not supported with a KV cache (dropout is for training)");
  }
  // Scale, causal, window and threads as attention() checks them; `checked` also carries the
  // float32 range check's inputs below.
  core::AttentionParams checked;
  core::apply_call_options(options, d, checked);
  checked.shape.h = h;
  core::apply_score_modifiers(options, checked);
  const std::string& kernel = options.kernel;
  // Asked once: hwy's target query was 5 % of a short call.
  static const bool have_simd = !kernels::simd_targets().empty();
  if (!kernel.empty() && kernel != "decode_scalar" && kernel != "reference" &&
      !(kernel == "decode_hwy" && have_simd)) {
    throw Error("kernel " + kernel, "cannot run a cached call (available: " +
                                        std::string(have_simd ? "decode_hwy, " : "") +
                                        "decode_scalar, reference)");
  }
  const int threads = checked.threads;
  const double q_bound = core::require_finite({&q}, threads).front();

  kernels::decode::DecodeCall call;
  call.b = count;
  call.h = h;
  call.hkv = co.kv_heads;
  call.nq = nq;
  call.d = d;
  call.dv = co.dv;
  call.k_type = kv_type(co.storage);
  call.v_type = call.k_type;
  call.q = {q.data, q.dtype, core::canonical_strides(q.strides)};
  call.layout = &impl.layout;
  call.scale = checked.scale;
  call.modifiers = checked.modifiers;
  call.masking = checked.masking;
  double keys = 0.0;  // over every sequence: what the decode threads share
  for (SequenceId id : sequences) {
    const cache::SequenceSnapshot snap = impl.snapshot(id);
    const std::int64_t nk = snap.length - snap.first_row;
    if (snap.first_row > 0 && nq > 0) {
      // The gathered rows start at first_row: the call must not reach before them. Query 0
      // (position length - nq) sees the earliest keys.
      const core::KeyRange range =
          core::allowed_key_range(call.masking, snap.length, snap.length - nq);
      if (range.first < snap.first_row && range.first < range.last) {
        throw Error(sequence_subject(id),
                    "rows before " + std::to_string(snap.first_row) +
                        " were forgotten, but the query at position " +
                        std::to_string(snap.length - nq) + " may attend from row " +
                        std::to_string(range.first) + " (a window must exclude them)");
      }
    }
    call.sequences.push_back(snap);
    call.nk.push_back(nk);
    keys += static_cast<double>(nk);
  }
  call.threads = core::threads_for_work(
      options.threads, keys * static_cast<double>(h) * static_cast<double>(nq) *
                           static_cast<double>(d + co.dv));

  // The float32 range checks of the other kernels, with the cache's bounds on what its pages
  // hold (the largest stored magnitudes, as the kernels dequantise them): a call float32 cannot
  // represent goes to the float64 reference.
  checked.shape = {count, h, co.kv_heads, nq, 0, d, co.dv};
  for (std::int64_t nk : call.nk) checked.shape.nk = std::max(checked.shape.nk, nk);
  checked.q.dtype = q.dtype;
  checked.magnitudes.q = q_bound;
  impl.magnitudes(checked.magnitudes.k, checked.magnitudes.v);
  const std::string float32_reason = kernels::float32_declines(checked);
  if (!float32_reason.empty() && !kernel.empty() && kernel != "reference") {
    throw Error("kernel " + kernel, "cannot run this call: " + float32_reason);
  }
  const bool use_reference = kernel == "reference" || !float32_reason.empty();

  const Shape out_shape = rank4 ? Shape{count, h, nq, co.dv} : Shape{h, nq, co.dv};
  const Shape lse_shape = rank4 ? Shape{count, h, nq} : Shape{h, nq};
  core::MemoryEstimate estimate;
  estimate.outputs = core::tensor_bytes(out_shape, options.out_dtype);
  if (options.return_lse) {
    estimate.outputs =
        core::saturating_add(estimate.outputs, core::tensor_bytes(lse_shape, options.out_dtype));
  }
  estimate.workspace = kernels::decode::decode_workspace_bytes(call, call.threads);
  core::check_memory_budget(estimate, options.max_memory, "attention_cached");

  AttentionResult result;
  result.threads = call.threads;
  result.out = Tensor(options.out_dtype, out_shape, "output");
  if (options.return_lse) result.lse = Tensor(options.out_dtype, lse_shape, "lse");
  if (use_reference) {
    run_reference(q, cache, sequences, options, result, rank4);
    result.kernel = "reference";
    return result;
  }
  core::bind_output(call.out, result.out.mutable_view(), out_shape);
  if (options.return_lse) core::bind_output(call.lse, result.lse.mutable_view(), lse_shape, false);
  const bool scalar = kernel == "decode_scalar" || !have_simd;
  const core::KernelStatus status =
      scalar ? kernels::decode::decode_run_scalar(call) : kernels::decode::decode_run_hwy(call);
  if (status == core::KernelStatus::kOutOfMemory) {
    throw Error("attention_cached", "out of memory: the decode kernel could not allocate its "
                                    "workspace (about " +
                                        core::format_bytes(estimate.workspace) + ")");
  }
  result.kernel = scalar ? "decode_scalar" : "decode_hwy";
  return result;
}

}  // namespace qkv
