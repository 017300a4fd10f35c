// attention_fwd_unfused_blas: attention as most code writes it, two matrix products with a
// softmax between them, each step as fast as the machine's CBLAS makes it:
//
//   for each (b, h, block of 256 query rows):   tasks on core::parallel_for
//     S = scale · Q_blk · K_h^T              sgemm, 256 x nk, S materialised in memory
//     S += mask, -inf where forbidden        only with causal/window/mask, one pass
//     P = softmax_rows(S)                    vectorised exp (softmax_rows_hwy.cc)
//     O_blk = P · V_h                        sgemm, 256 x dv
//
// It is the in-process baseline of `qkv bench` and the fastest choice where the n x n score
// matrix is small. Its costs are what the fused kernel avoids: the nq x nk matrix (4·nq·nk
// bytes, written by one sgemm, read and written by the softmax, read by the next: about 16·n²
// bytes of memory traffic per head), the full square computed under causal masking, and no
// sharing of K/V between the heads of a group.
//
// Threads: exactly params.threads of ours, each running single-threaded sgemm calls on its own
// tasks; the attention entry point has set OpenBLAS to one thread with its pool joined
// (blas_threads.h: weak symbols, so any CBLAS links). No hidden threads beyond --threads, no
// data handed between threads (ThreadSanitizer cannot see inside OpenBLAS's own pool), and since
// the row blocks do not depend on the thread count, neither do the bits. With one (b, h) and fewer
// than 256·threads rows, fewer tasks than threads: this kernel is for the many-heads case.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "core/mask_rule.h"
#include "core/parallel_for.h"
#include "core/progress.h"
#include "kernels/blas_threads.h"
#include "kernels/fused_common.h"
#include "kernels/kernel.h"
#include "kernels/softmax_rows.h"

namespace qkv::kernels {
namespace {

// A float32 matrix view of operand rows: direct when the operand already is row-major float32
// with unit column stride, else a packed float32 copy (float64, bfloat16 and float16 operands
// are converted there: CBLAS sgemm reads float32 only).
struct Matrix {
  const float* data = nullptr;
  int ld = 0;
  std::vector<float> copy;
};

void view_or_pack(const core::InputOperand& op, std::int64_t b, std::int64_t h, std::int64_t row0,
                  std::int64_t rows, std::int64_t cols, Matrix& m) {
  const core::Strides4& st = op.strides;
  if (op.dtype == DType::kF32 && st.col == 1 && (st.row >= cols || rows == 1) &&
      st.row <= std::numeric_limits<int>::max()) {
    m.data = static_cast<const float*>(op.data) + st.at(b, h, row0, 0);
    m.ld = static_cast<int>(std::max<std::int64_t>(st.row, cols));
    return;
  }
  m.copy.resize(static_cast<std::size_t>(rows * cols));
  fused::pack_rows(op, b, h, row0, rows, cols, m.copy.data(), cols);
  m.data = m.copy.data();
  m.ld = static_cast<int>(cols);
}

}  // namespace

#if !QKV_HAVE_HWY
// The portable build's softmax_rows.
void softmax_rows(float* s, std::int64_t n, std::int64_t ld, std::int64_t rows, float* row_max,
                  float* row_sum) noexcept {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* x = s + r * ld;
    float m = -kSoftmaxInf;
    for (std::int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
    if (m == -kSoftmaxInf || m == kSoftmaxInf) {
      softmax_row_special(x, n, m, row_max[r], row_sum[r]);
      continue;
    }
    float sum = 0.0f;
    for (std::int64_t j = 0; j < n; ++j) {
      x[j] = std::exp(x[j] - m);
      sum += x[j];
    }
    for (std::int64_t j = 0; j < n; ++j) x[j] *= 1.0f / sum;
    row_max[r] = m;
    row_sum[r] = sum;
  }
}
#endif

std::int64_t unfused_workers(const core::AttentionShape& shape, int threads) noexcept {
  const std::int64_t tasks =
      shape.b * shape.h * ((shape.nq + kUnfusedRowBlock - 1) / kUnfusedRowBlock);
  return std::clamp<std::int64_t>(tasks, 1, std::max(threads, 1));
}

std::string attention_fwd_unfused_blas_declines(const core::AttentionParams& p) {
  if (p.dropout.active()) return "it draws no dropout (the fused kernels do)";
  const core::AttentionShape& s = p.shape;
  const double bytes = 4.0 * static_cast<double>(std::min(s.nq, kUnfusedRowBlock)) *
                       static_cast<double>(s.nk) *
                       static_cast<double>(unfused_workers(s, p.threads));
  if (bytes > kUnfusedWorkspaceCapBytes) {
    return "its score blocks (" + std::to_string(std::min(s.nq, kUnfusedRowBlock)) +
           " x nk per thread) " + "would need " + std::to_string(bytes / (1 << 30)) +
           " GiB (budget 2 GiB)";
  }
  if (s.nk == 0 || s.d == 0 || s.dv == 0) {
    return "no keys, no head dimension or no value columns (CBLAS wants ld >= 1)";
  }
  const std::int64_t int_max = std::numeric_limits<int>::max();
  if (s.nq > int_max || s.nk > int_max || s.d > int_max || s.dv > int_max) {
    return "a dimension exceeds CBLAS's int range";
  }
  if (std::string why = float32_declines(p); !why.empty()) return why;
  if (std::string why = plain_only_declines(p); !why.empty()) return why;
  return blas_address_space_shortfall(unfused_workers(s, p.threads));
}

namespace {

// Tasks [begin, end) of the unfused kernel on one thread, with its own score and output blocks.
void run_tasks(const core::AttentionParams& p, std::int64_t begin, std::int64_t end) {
  const core::AttentionShape& sh = p.shape;
  const std::int64_t blocks = (sh.nq + kUnfusedRowBlock - 1) / kUnfusedRowBlock;
  const int nk = static_cast<int>(sh.nk);
  const int d = static_cast<int>(sh.d);
  const int dv = static_cast<int>(sh.dv);
  const float scale = static_cast<float>(p.scale);
  const bool masked = p.masking.has_structure() || p.masking.mask != nullptr;
  const std::int64_t rows_max = std::min(kUnfusedRowBlock, sh.nq);
  std::vector<float> scores(static_cast<std::size_t>(rows_max * sh.nk));
  std::vector<float> out(static_cast<std::size_t>(rows_max * sh.dv));
  std::vector<float> row_max(static_cast<std::size_t>(rows_max));
  std::vector<float> row_sum(static_cast<std::size_t>(rows_max));
  Matrix q, k, v;
  for (std::int64_t task = begin; task < end; ++task) {
    const std::int64_t blk = task % blocks;
    const std::int64_t h = (task / blocks) % sh.h;
    const std::int64_t b = task / (blocks * sh.h);
    const std::int64_t hk = h / sh.group();
    const std::int64_t i0 = blk * kUnfusedRowBlock;
    const std::int64_t rows = std::min(kUnfusedRowBlock, sh.nq - i0);
    view_or_pack(p.q, b, h, i0, rows, sh.d, q);
    view_or_pack(p.k, b, hk, 0, sh.nk, sh.d, k);
    view_or_pack(p.v, b, hk, 0, sh.nk, sh.dv, v);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), nk, d, scale,
                q.data, q.ld, k.data, k.ld, 0.0f, scores.data(), nk);
    for (std::int64_t r = 0; masked && r < rows; ++r) {
      // -inf outside the row's causal/window interval, the mask's bias inside it.
      const std::int64_t i = i0 + r;
      float* row = scores.data() + r * sh.nk;
      const core::KeyRange range =
          core::allowed_key_range(p.masking, sh.nk, i + sh.diagonal_offset());
      std::fill(row, row + range.first, -fused::kInfF);
      std::fill(row + range.last, row + sh.nk, -fused::kInfF);
      for (std::int64_t j = range.first; p.masking.mask != nullptr && j < range.last; ++j) {
        const float bias = static_cast<float>(core::mask_bias(p.masking, b, h, i, j));
        row[j] = bias == -fused::kInfF ? -fused::kInfF : row[j] + bias;
      }
    }
    softmax_rows(scores.data(), sh.nk, sh.nk, rows, row_max.data(), row_sum.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), dv, nk, 1.0f,
                scores.data(), nk, v.data, v.ld, 0.0f, out.data(), dv);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = i0 + r;
      fused::store_row(p.out, b, h, i, 0, out.data() + r * sh.dv, sh.dv, 1.0f);
      if (p.weights.data != nullptr) {
        fused::store_row(p.weights, b, h, i, 0, scores.data() + r * sh.nk, sh.nk, 1.0f);
      }
      if (p.lse.data != nullptr) {
        const SoftmaxState st{row_max[static_cast<std::size_t>(r)],
                              row_sum[static_cast<std::size_t>(r)]};
        core::store_real(p.lse.data, p.lse.dtype, p.lse.strides.at(b, h, i, 0), log_sum_exp(st));
      }
    }
    core::report_rows(p, rows);
  }
}

}  // namespace

core::KernelStatus attention_fwd_unfused_blas(const core::AttentionParams& p) noexcept {
  const core::AttentionShape& sh = p.shape;
  const std::int64_t blocks = (sh.nq + kUnfusedRowBlock - 1) / kUnfusedRowBlock;
  const std::int64_t tasks = sh.b * sh.h * blocks;
  // The blocks are std::vectors: a failed allocation is reported, never thrown through here.
  std::atomic<bool> out_of_memory{false};
  try {
    core::parallel_for(tasks, p.threads, [&](std::int64_t begin, std::int64_t end) {
      try {
        run_tasks(p, begin, end);
      } catch (const std::bad_alloc&) {
        out_of_memory.store(true, std::memory_order_relaxed);
      }
    });
  } catch (const std::bad_alloc&) {
    return core::KernelStatus::kOutOfMemory;
  }
  return out_of_memory ? core::KernelStatus::kOutOfMemory : core::KernelStatus::kOk;
}

}  // namespace qkv::kernels
