// The public attention entry points: validate once, choose a kernel once, run it.
#include "qkv/attention.h"

#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/format_bytes.h"
#include "core/floating_point.h"
#include "core/memory_budget.h"
#include "core/overlap.h"
#include "core/openmp_team.h"
#include "core/parallel_for.h"
#include "core/progress.h"
#include "core/validate.h"
#include "kernels/blas_threads.h"
#include "kernels/kernel.h"
#include "kernels/kernel_choice.h"
#include "qkv/error.h"

namespace qkv {
namespace {

const kernels::AttentionKernel& choose_kernel(const core::AttentionParams& params,
                                              const std::string& requested) {
  return kernels::choose_from(kernels::attention_kernels(), params, requested, "kernel");
}

std::uint64_t workspace_bytes(const core::AttentionCall& call, const AttentionOptions& options) {
  return kernels::attention_workspace_bytes(call.params.shape, call.params.threads, options.kernel,
                                            call.params.compute);
}

// Whether `kernel` checks K and V as it reads them and reads every element of them in this
// call, so that validation need not scan them first: a kernel that says so (decode_hwy, where
// the scan was a second pass over all of K and V, as long as the kernel's own) on a call whose
// rows together see every key (no window; a causal row set ends with a row that sees them all)
// and that is not a packed batch.
bool checks_kv_as_it_reads(const core::AttentionCall& call,
                           const kernels::AttentionKernel& kernel) {
  const core::AttentionParams& p = call.params;
  return kernel.checks_kv_as_it_reads && call.cu_q.empty() && p.shape.nq > 0 &&
         p.masking.window_left < 0 && p.masking.window_right < 0;
}

// K and V of a call validated with defer_kv_scan, and the flag a kernel that checks them as it
// reads them sets.
struct DeferredScan {
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
  std::atomic<bool>* flag = nullptr;
};

std::string bind_and_run(core::AttentionCall& call, const AttentionOptions& options,
                         const AttentionOutputs& outputs, const DeferredScan& deferred = {}) {
  core::AttentionParams& params = call.params;
  core::bind_output(params.out, outputs.out, call.out_shape);
  if (outputs.weights) core::bind_output(params.weights, *outputs.weights, call.weights_shape);
  if (outputs.lse) core::bind_output(params.lse, *outputs.lse, call.lse_shape, false);
  const kernels::AttentionKernel* chosen = &choose_kernel(params, options.kernel);
  params.kv_unchecked = nullptr;
  if (call.kv_scan_deferred) {
    if (checks_kv_as_it_reads(call, *chosen)) {
      params.kv_unchecked = deferred.flag;
    } else {
      // The scan this kernel does not do; its true bounds may change the choice.
      core::scan_deferred_kv(call, *deferred.k, *deferred.v, options);
      chosen = &choose_kernel(params, options.kernel);
    }
  }
  const kernels::AttentionKernel& kernel = *chosen;
  // Whichever kernel runs: unfused_blas needs one-thread BLAS calls on its threads, and an
  // idle OpenBLAS pool spins beside any kernel.
  const kernels::SingleThreadedBlas one_blas_thread;
  if (options.progress) {
    // A packed batch's params cover all its rows (b = 1, nq = total_q).
    call.progress = std::make_unique<core::Progress>(
        options.progress, params.shape.b * params.shape.h * params.shape.nq);
    params.progress = call.progress.get();
  }
  // A packed batch runs sequence by sequence, each as a call of its own rows: no work crosses
  // sequences, and every kernel serves packed batches with its own per-call tasks.
  core::KernelStatus status = core::KernelStatus::kOk;
  if (call.cu_q.empty()) {
    status = kernel.run(params);
  } else {
    for (std::size_t s = 0; s + 1 < call.cu_q.size() && status == core::KernelStatus::kOk; ++s) {
      status = kernel.run(core::sequence_params(call, s));
    }
  }
  if (status == core::KernelStatus::kOutOfMemory) {
    throw Error("attention",
                "out of memory: kernel " + std::string(kernel.name) +
                    " could not allocate its workspace (about " +
                    core::format_bytes(kernels::attention_workspace_bytes(
                        params.shape, params.threads, std::string(kernel.name), params.compute)) +
                    ")");
  }
  return std::string(kernel.name);
}

// bind_and_run on a call validated with defer_kv_scan. When the kernel checked K and V as it
// read them and found an element not below 2^32 in magnitude (or not finite), the scan names a
// bad element as it always did, or sets the true bounds, and the call runs again with them
// (every kernel writes all of its outputs, so the first run leaves nothing behind).
std::string run_checking_kv(core::AttentionCall& call, const AttentionOptions& options,
                            const AttentionOutputs& outputs, const TensorView& k,
                            const TensorView& v) {
  std::atomic<bool> kv_unchecked{false};
  const std::string kernel =
      bind_and_run(call, options, outputs, DeferredScan{&k, &v, &kv_unchecked});
  if (!kv_unchecked.load(std::memory_order_relaxed)) return kernel;
  core::scan_deferred_kv(call, k, v, options);
  return bind_and_run(call, options, outputs);
}

}  // namespace

AttentionResult attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options) {
  const core::FloatingPointScope floating_point;  // the default environment (floating_point.h)
  core::AttentionCall call = core::validate_attention(q, k, v, options, true);
  if (options.out_dtype != DType::kF32 && options.out_dtype != DType::kF64 &&
      options.out_dtype != DType::kF16) {
    throw Error("out_dtype", "must be float32, float64 or float16");
  }
  // float16 outputs are computed in float32 and rounded once at the end.
  const DType computed = options.out_dtype == DType::kF16 ? DType::kF32 : options.out_dtype;
  core::check_memory_budget(
      core::attention_memory(call, options, true, workspace_bytes(call, options)),
      options.max_memory, "attention");
  AttentionResult result;
  result.out = Tensor(computed, call.out_shape, "output");
  AttentionOutputs outputs{result.out.mutable_view(), std::nullopt, std::nullopt};
  if (options.return_weights) {
    result.weights = Tensor(computed, call.weights_shape, "weights");
    outputs.weights = result.weights.mutable_view();
  }
  if (options.return_lse) {
    result.lse = Tensor(computed, call.lse_shape, "lse");
    outputs.lse = result.lse.mutable_view();
  }
  result.kernel = run_checking_kv(call, options, outputs, k, v);
  result.compute = call.params.compute;
  result.threads = call.params.threads;
  if (computed != options.out_dtype) {
    for (const Tensor* t : {&result.out, &result.weights, &result.lse}) {
      if (!t->empty()) core::require_fits_float16(*t);
    }
    result.out = result.out.to(options.out_dtype);
    if (!result.weights.empty()) result.weights = result.weights.to(options.out_dtype);
    if (!result.lse.empty()) result.lse = result.lse.to(options.out_dtype);
  }
  return result;
}

std::string attention_into(const TensorView& q, const TensorView& k, const TensorView& v,
                           const AttentionOptions& options, const AttentionOutputs& outputs) {
  const core::FloatingPointScope floating_point;  // the default environment (floating_point.h)
  core::AttentionCall call = core::validate_attention(q, k, v, options, true);
  // An output that shares memory with an input would be read after it was overwritten.
  std::vector<const TensorView*> inputs = {&q, &k, &v};
  for (const auto* optional : {&options.mask, &options.alibi_slopes, &options.sinks,
                               &options.cu_seqlens_q, &options.cu_seqlens_k}) {
    if (optional->has_value()) inputs.push_back(&**optional);
  }
  const TensorView out = outputs.out;
  std::optional<TensorView> weights, lse;
  std::vector<const TensorView*> written = {&out};
  if (outputs.weights) written.push_back(&weights.emplace(*outputs.weights));
  if (outputs.lse) written.push_back(&lse.emplace(*outputs.lse));
  core::require_no_overlap(inputs, written);
  if (!call.cu_q.empty() && outputs.weights) {
    throw Error(outputs.weights->name,
                "the weights output cannot be combined with a packed "
                "batch (cu_seqlens)");
  }
  core::check_memory_budget(
      core::attention_memory(call, options, false, workspace_bytes(call, options)),
      options.max_memory, "attention");
  return run_checking_kv(call, options, outputs, k, v);
}

std::string explain_kernel_choice(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const AttentionOptions& options) {
  core::AttentionCall call = core::validate_attention(q, k, v, options);
  const kernels::AttentionKernel& chosen = choose_kernel(call.params, options.kernel);
  std::string text;
  bool after = false;
  for (const auto& kernel : kernels::attention_kernels()) {
    text += std::string(kernel.name) + ": ";
    if (&kernel == &chosen) {
      text += options.kernel.empty() ? "chosen" : "chosen (--kernel)";
      if (kernel.name.ends_with("_hwy")) {
        text += " (SIMD target " + kernels::simd_target_name();
        // Which products the fused kernel runs: bf16 dot products or float32.
        if (kernel.name == "fused_hwy") text += ", " + kernels::fused_hwy_path(call.params.compute, call.params.shape.d);
        text += ")";
      }
      after = true;
    } else if (after) {
      text += "not tried";
    } else if (!options.kernel.empty()) {
      text += "skipped (--kernel " + options.kernel + ")";
    } else if (const std::string reason = kernel.declines(call.params); !reason.empty()) {
      text += "declines: " + reason;
    } else {
      text += "passes: " + kernel.passes(call.params);
    }
    text += "\n";
  }
  return text;
}

std::int64_t threads_not_started() noexcept { return core::threads_not_started(); }

void use_openmp_threads(const std::string& library) { core::use_openmp_threads(library); }

std::string openmp_threads_library() { return core::openmp_threads_library(); }

std::vector<std::string> attention_kernel_names() {
  std::vector<std::string> names;
  for (const auto& kernel : kernels::attention_kernels()) names.emplace_back(kernel.name);
  return names;
}

}  // namespace qkv
