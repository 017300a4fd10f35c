// The public backward entry: validate once, check the memory budget, choose a backward kernel
// once, run it (a packed batch sequence by sequence), as attention() does for the forward.
#include "qkv/attention_backward.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/floating_point.h"
#include "core/format_bytes.h"
#include "core/half.h"
#include "core/memory_budget.h"
#include "core/out_of_memory.h"
#include "core/parallel_for.h"
#include "core/progress.h"
#include "core/validate_backward.h"
#include "kernels/backward_kernel.h"
#include "kernels/blas_threads.h"
#include "kernels/bwd_fused_driver.h"
#include "kernels/fused_common.h"
#include "kernels/kernel_choice.h"
#include "qkv/error.h"

namespace qkv {
namespace {

const kernels::BackwardKernel& choose_backward_kernel(const core::BackwardParams& params,
                                                      const std::string& requested) {
  return kernels::choose_from(kernels::backward_kernels(), params, requested, "backward kernel");
}

// One gradient's float32 sums (`shape`, from `sums`) rounded once to bf16 as Tensor::to rounds
// them (to nearest even, element by element: the same bits), in parallel blocks. Tensor::to,
// element by element through double and serial, took ~7 % of a 1-thread bf16 backward
// (n = 2048, d = 128, H = 8) and limited what a second thread gained.
Tensor rounded_to_bf16(const float* sums, const Shape& shape, const std::string& name,
                       int threads) {
  Tensor rounded(DType::kBF16, shape, name);
  auto* dst = static_cast<std::uint16_t*>(rounded.data());
  constexpr std::int64_t kBlock = std::int64_t{1} << 16;
  const std::int64_t count = rounded.numel();
  core::parallel_for((count + kBlock - 1) / kBlock, threads,
                     [&](std::int64_t begin, std::int64_t end) {
                       const std::int64_t last = std::min(count, end * kBlock);
                       for (std::int64_t e = begin * kBlock; e < last; ++e) {
                         dst[e] = core::float_to_bf16(sums[e]);
                       }
                     });
  return rounded;
}

// Where the kernels' float32 sums of bf16 gradients go: one block for dQ, dK and dV from the
// huge-buffer cache (fused::make_buffer; blocks of 4 MiB or more are kept between calls), so
// that the next call of the shape writes into mapped pages. Fresh tensors, touched first by
// the kernel, cost ~3 % of a 2-thread bf16 backward (n = 2048, d = 128, H = 8) in page faults
// and the system's zeroing. Zeroed, as a new Tensor is, in parallel.
struct GradientSums {
  kernels::fused::BufferOf<float> block;
  float* part[3] = {};
  GradientSums(const Shape* const (&shapes)[3], int threads) {
    std::int64_t sizes[3];
    std::int64_t total = 0;
    for (int g = 0; g < 3; ++g) {
      sizes[g] = (shape_numel(*shapes[g]) + 15) / 16 * 16;  // whole 64-byte lines
      total += sizes[g];
    }
    block = kernels::fused::make_buffer<float>(total, false);
    if (block == nullptr) {
      const auto bytes = static_cast<std::uint64_t>(total) * sizeof(float);
      throw core::OutOfMemory("attention_backward",
                              core::format_bytes_exact(bytes) +
                                  " for the float32 sums of the bf16 gradients",
                              bytes);
    }
    constexpr std::int64_t kChunk = std::int64_t{1} << 18;  // floats: 1 MiB
    core::parallel_for((total + kChunk - 1) / kChunk, threads,
                       [&](std::int64_t begin, std::int64_t end) {
                         const std::int64_t first = begin * kChunk;
                         const std::int64_t last = std::min(total, end * kChunk);
                         std::memset(block.get() + first, 0,
                                     static_cast<std::size_t>(last - first) * sizeof(float));
                       });
    float* at = block.get();
    for (int g = 0; g < 3; ++g) {
      part[g] = at;
      at += sizes[g];
    }
  }
};

}  // namespace

namespace kernels {

// The output and workspace bytes a backward call allocates: the gradients, the per-row lse and
// D, the dQ partials and each thread's tiles (the unfused kernel's 256 x nk blocks bound them).
core::MemoryEstimate backward_memory(const core::AttentionShape& s, int threads, DType grad,
                                     bool sinks) noexcept {
  core::MemoryEstimate estimate;
  const auto u = [](std::int64_t x) {
    return static_cast<std::uint64_t>(std::max<std::int64_t>(x, 0));
  };
  const auto element = static_cast<std::uint64_t>(dtype_size(grad));
  const std::uint64_t q_elements =
      core::saturating_mul(core::saturating_mul(core::saturating_mul(u(s.b), u(s.h)), u(s.nq)),
                           u(s.d));
  const std::uint64_t kv_rows =
      core::saturating_mul(core::saturating_mul(u(s.b), u(s.hkv)), u(s.nk));
  const std::uint64_t kv_elements =
      core::saturating_mul(kv_rows, core::saturating_add(u(s.d), u(s.dv)));
  estimate.outputs =
      core::saturating_mul(element, core::saturating_add(q_elements, kv_elements));
  if (sinks) {
    estimate.outputs =
        core::saturating_add(estimate.outputs, core::saturating_mul(element + 8, u(s.h)));
  }
  const std::uint64_t rows = core::saturating_mul(core::saturating_mul(u(s.b), u(s.h)), u(s.nq));
  std::uint64_t workspace = core::saturating_mul(2 * element + 8, rows);
  const std::int64_t chunks = bwd::chunks_for(s, 64, dtype_size(grad));
  workspace = core::saturating_add(
      workspace, core::saturating_mul(core::saturating_mul(rows, u(s.d)),
                                      core::saturating_mul(element, u(chunks - 1))));
  const std::uint64_t tile = 256;
  const std::uint64_t per_thread = core::saturating_mul(
      element, core::saturating_add(
                   core::saturating_mul(3 * tile, std::max(u(s.nk), tile)),
                   core::saturating_mul(2 * tile + 2 * std::max(u(s.nk), tile), u(s.d) + u(s.dv))));
  const auto members = static_cast<std::uint64_t>(std::max(threads, 1));
  workspace = core::saturating_add(workspace, core::saturating_mul(per_thread, members));
  // The row-panel driver's dK/dV buffers of its query chunks (bwd_row_panel_driver.h); its
  // per-thread panels are within per_thread's bound.
  workspace = core::saturating_add(
      workspace, static_cast<std::uint64_t>(bwd::row_panel_chunk_bytes_bound(s, element)));
  estimate.workspace = workspace;
  return estimate;
}

}  // namespace kernels

namespace {

// A gradient tensor's slot in the params: contiguous, of the compute type.
core::OutputOperand slot_of(Tensor& tensor) {
  const MutableTensorView view = tensor.mutable_view();
  return {view.data, view.dtype, core::canonical_strides(view.strides)};
}

}  // namespace

namespace {

// The type the kernels compute the gradients in: float64 for a float64 call, else float32 (a
// bf16 call's accumulators).
DType kernel_gradient_type(DType compute) {
  return compute == DType::kF64 ? DType::kF64 : DType::kF32;
}

// The bytes of the gradients the caller gets when they are converted from the kernels' float32
// ones (bf16 gradients): a second set, of the smaller type.
std::uint64_t converted_gradient_bytes(const core::AttentionShape& s, DType grad, bool sinks) {
  return kernels::backward_memory(s, 1, grad, sinks).outputs;
}

// The bf16 products' workspace (attention_bwd_fused_hwy.cc, bwd_bf16-inl.h, bwd_amx-inl.h): Q
// and dO as bf16 rows and pairs of rows, K and V packed per key tile, and each thread's P and
// dS pairs; an upper bound for both (head dims padded to 32 values, AMX's whole tiles of 16
// pairs; query rows to whole tiles of 16 pairs, and a tile's spare rows; keys to whole
// 128-key tiles).
std::uint64_t bf16_workspace(const core::AttentionShape& s, int threads) {
  const auto u = [](std::int64_t x) {
    return static_cast<std::uint64_t>(std::max<std::int64_t>(x, 0));
  };
  const auto padded = [&](std::int64_t x) { return (u(x) + 32) / 32 * 32; };
  const std::uint64_t query_rows =
      core::saturating_add(core::saturating_mul(u(s.b) * u(s.h), u(s.nq) + 32), 16);
  const std::uint64_t key_rows = core::saturating_mul(u(s.b) * u(s.hkv), u(s.nk) + 128);
  const std::uint64_t dims = 2 * padded(s.d) + 2 * padded(s.dv);
  std::uint64_t bytes = core::saturating_mul(core::saturating_mul(query_rows, dims), 2);
  bytes = core::saturating_add(
      bytes, core::saturating_mul(core::saturating_mul(key_rows, 2 * padded(s.d) + padded(s.dv)),
                                  2));
  // The packed operands are one block, rounded up to whole 2 MiB huge pages when 4 MiB or
  // more (fused::make_buffer).
  bytes = core::saturating_add(bytes, std::uint64_t{2} << 20);
  const std::uint64_t per_thread = 4 * 128 * 128 * 2;
  return core::saturating_add(
      bytes, core::saturating_mul(per_thread, static_cast<std::uint64_t>(std::max(threads, 1))));
}

}  // namespace

std::uint64_t attention_backward_memory(const TensorView& q, const TensorView& k,
                                        const TensorView& v, const AttentionOptions& options) {
  const core::AttentionCall call = core::validate_attention(q, k, v, options);
  const DType compute = call.params.compute == DType::kF16 ? DType::kF32 : call.params.compute;
  const DType wanted = core::gradient_dtype(compute, options.grad_dtype);
  const DType grad = kernel_gradient_type(compute);
  std::uint64_t bytes = kernels::backward_memory(call.params.shape, call.params.threads, grad,
                                                 options.sinks.has_value())
                            .total();
  if (compute == DType::kBF16) {
    bytes = core::saturating_add(bytes,
                                 bf16_workspace(call.params.shape, call.params.threads));
  }
  if (wanted != grad) {
    bytes = core::saturating_add(
        bytes, converted_gradient_bytes(call.params.shape, wanted, options.sinks.has_value()));
  }
  return bytes;
}

AttentionGradients attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& lse,
                                      const TensorView& grad_out, const AttentionOptions& options) {
  const core::FloatingPointScope floating_point;  // the default environment (floating_point.h)
  core::BackwardCall call = core::validate_attention_backward(q, k, v, out, lse, grad_out, options);
  core::BackwardParams& bp = call.params;
  if (const std::string reason = kernels::backward_float64_declines(bp); !reason.empty()) {
    throw Error("attention_backward", "cannot compute these gradients: " + reason);
  }
  const DType grad = kernel_gradient_type(bp.forward.compute);
  core::MemoryEstimate needed = kernels::backward_memory(bp.forward.shape, bp.forward.threads,
                                                         grad, options.sinks.has_value());
  if (bp.forward.compute == DType::kBF16) {
    needed.workspace = core::saturating_add(
        needed.workspace, bf16_workspace(bp.forward.shape, bp.forward.threads));
  }
  if (call.grad_dtype != grad) {
    needed.outputs = core::saturating_add(
        needed.outputs,
        converted_gradient_bytes(bp.forward.shape, call.grad_dtype, options.sinks.has_value()));
  }
  core::check_memory_budget(needed, options.max_memory, "attention_backward");
  AttentionGradients result;
  // bf16 gradients: the float32 sums in a kept block (GradientSums), rounded at the end.
  const bool rounded = call.grad_dtype == DType::kBF16 && grad == DType::kF32;
  std::optional<GradientSums> sums;
  if (rounded) {
    const Shape* const shapes[3] = {&q.shape, &k.shape, &v.shape};
    sums.emplace(shapes, bp.forward.threads);
    const auto slot = [&](const Shape& shape, float* data) {
      return core::OutputOperand{data, DType::kF32,
                                 core::canonical_strides(contiguous_strides(shape))};
    };
    bp.dq = slot(q.shape, sums->part[0]);
    bp.dk = slot(k.shape, sums->part[1]);
    bp.dv = slot(v.shape, sums->part[2]);
  } else {
    result.dq = Tensor(grad, q.shape, "dq");
    result.dk = Tensor(grad, k.shape, "dk");
    result.dv = Tensor(grad, v.shape, "dv");
    bp.dq = slot_of(result.dq);
    bp.dk = slot_of(result.dk);
    bp.dv = slot_of(result.dv);
  }
  const core::AttentionShape& s = bp.forward.shape;
  std::vector<double> dsinks;
  const bool has_sinks = options.sinks.has_value();
  if (has_sinks && s.h > 0) {
    dsinks.assign(static_cast<std::size_t>(s.h), 0.0);
    bp.dsinks = dsinks.data();
  }
  const kernels::BackwardKernel& kernel = choose_backward_kernel(bp, options.kernel);
  const kernels::SingleThreadedBlas one_blas_thread;
  if (options.progress) {
    // The backward counts key rows of single kv heads: its tasks own dK and dV rows. A packed
    // batch's params cover all its rows (b = 1, nk = total_k), and each sequence's params are
    // cut from call.forward's, so both point at the one counter.
    call.forward.progress =
        std::make_unique<core::Progress>(options.progress, s.b * s.hkv * s.nk);
    bp.forward.progress = call.forward.progress.get();
    call.forward.params.progress = call.forward.progress.get();
  }
  core::KernelStatus status = core::KernelStatus::kOk;
  if (call.forward.cu_q.empty()) {
    status = kernel.run(bp);
  } else {
    for (std::size_t seq = 0;
         seq + 1 < call.forward.cu_q.size() && status == core::KernelStatus::kOk; ++seq) {
      status = kernel.run(core::sequence_backward_params(call, seq));
    }
  }
  if (status == core::KernelStatus::kOutOfMemory) {
    throw Error("attention_backward", "out of memory: kernel " + std::string(kernel.name) +
                                          " could not allocate its workspace");
  }
  // Sinks given: a [H] gradient, [0] when there are no query heads.
  if (has_sinks) {
    result.dsinks = Tensor(grad, {s.h}, "dsinks");
    for (std::int64_t h = 0; h < s.h; ++h) {
      core::store_real(result.dsinks.data(), grad, h, dsinks[static_cast<std::size_t>(h)]);
    }
  }
  // bf16 gradients: the kernels' float32 sums rounded to nearest even, once.
  if (rounded) {
    result.dq = rounded_to_bf16(sums->part[0], q.shape, "dq", bp.forward.threads);
    result.dk = rounded_to_bf16(sums->part[1], k.shape, "dk", bp.forward.threads);
    result.dv = rounded_to_bf16(sums->part[2], v.shape, "dv", bp.forward.threads);
    if (has_sinks) result.dsinks = result.dsinks.to(call.grad_dtype);
  } else if (call.grad_dtype != grad) {
    for (Tensor* t : {&result.dq, &result.dk, &result.dv}) *t = t->to(call.grad_dtype);
    if (has_sinks) result.dsinks = result.dsinks.to(call.grad_dtype);
  }
  result.kernel = std::string(kernel.name);
  result.compute = bp.forward.compute;
  result.threads = bp.forward.threads;
  return result;
}

std::vector<std::string> attention_backward_kernel_names() {
  std::vector<std::string> names;
  for (const auto& kernel : kernels::backward_kernels()) names.emplace_back(kernel.name);
  return names;
}

std::string explain_backward_kernel_choice(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const TensorView& out,
                                           const TensorView& lse, const TensorView& grad_out,
                                           const AttentionOptions& options) {
  core::BackwardCall call = core::validate_attention_backward(q, k, v, out, lse, grad_out, options);
  // The gradients as attention_backward binds them (contiguous, of the compute type), for the
  // kernels' checks; nothing is written through these slots.
  const DType grad = kernel_gradient_type(call.params.forward.compute);
  static double unused = 0.0;
  const auto slot = [&](const Shape& shape) {
    return core::OutputOperand{&unused, grad, core::canonical_strides(contiguous_strides(shape))};
  };
  call.params.dq = slot(q.shape);
  call.params.dk = slot(k.shape);
  call.params.dv = slot(v.shape);
  const kernels::BackwardKernel& chosen = choose_backward_kernel(call.params, options.kernel);
  std::string text;
  bool after = false;
  for (const auto& kernel : kernels::backward_kernels()) {
    text += std::string(kernel.name) + ": ";
    if (&kernel == &chosen) {
      text += options.kernel.empty() ? "chosen" : "chosen (--kernel)";
      // How a bf16 call's products run: AMX tiles, vdpbf16ps, or float32 FMAs on bf16-rounded
      // operands.
      if (call.params.forward.compute == DType::kBF16) {
        const bool hwy = kernel.name == "fused_hwy";
        text += hwy && kernels::backward_bf16_amx_available() ? ", bf16 products on AMX tiles"
                : hwy && kernels::backward_bf16_dots_available()
                    ? ", bf16 dot products (vdpbf16ps)"
                    : ", bf16 operands in float32 products";
        // Where the weights' row statistics come from (bwd_row_stats.h says why).
        text += hwy && kernels::backward_bf16_forward_stats(call.params)
                    ? "; weighs with the forward's lse and D = dO·O (scores bounded)"
                    : "; computes the rows' max, sum and D again";
      }
      after = true;
    } else if (after) {
      text += "not tried";
    } else if (!options.kernel.empty()) {
      text += "skipped (--kernel " + options.kernel + ")";
    } else {
      text += "declines: " + kernel.declines(call.params);
    }
    text += "\n";
  }
  return text;
}

}  // namespace qkv
