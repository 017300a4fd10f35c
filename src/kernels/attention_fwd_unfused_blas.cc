// attention_fwd_unfused_blas: attention as most code writes it, two matrix products with a
// softmax between them, each step as fast as the machine's CBLAS makes it:
//
//   for each (b, h):                       heads one after another
//     S = scale · Q_h · K_h^T              sgemm, nq x nk, S materialised in memory
//     S += mask, -inf where forbidden      only with causal/window/mask, one pass
//     P = softmax_rows(S)                  vectorised exp (softmax_rows_hwy.cc), our threads
//     O_h = P · V_h                        sgemm, nq x dv
//
// It is the in-process baseline of `qkv bench` and the fastest choice where the n x n score
// matrix is small. Its costs are what the fused kernel avoids: the nq x nk matrix (4·nq·nk
// bytes, written by one sgemm, read and written by the softmax, read by the next: about 16·n²
// bytes of memory traffic per head), the full square computed under causal masking, and no
// sharing of K/V between the heads of a group.
//
// Threads: OpenBLAS parallelises each sgemm internally; the call sets its thread count to
// exactly params.threads for the duration (through a weak symbol, so any CBLAS links) and puts
// the previous count back. The softmax runs on core::parallel_for over rows. Rows are
// independent and the sgemm's blocking does not depend on the thread count in OpenBLAS's
// row-major paths, but bitwise identity across thread counts is promised only for the fused
// kernels.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/mask_rule.h"
#include "core/parallel_for.h"
#include "kernels/fused_common.h"
#include "kernels/kernel.h"
#include "kernels/softmax_rows.h"

extern "C" void openblas_set_num_threads(int num_threads) __attribute__((weak));
extern "C" int openblas_get_num_threads(void) __attribute__((weak));

namespace qkv::kernels {
namespace {

// The n x n workspace above which this kernel declines (the fused kernel has no such limit).
constexpr double kWorkspaceBudgetBytes = 2.0 * 1024 * 1024 * 1024;

// A float32 matrix view of operand rows: direct when the operand already is row-major float32
// with unit column stride, else a packed copy.
struct Matrix {
  const float* data = nullptr;
  int ld = 0;
  std::vector<float> copy;
};

void view_or_pack(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                  std::int64_t rows, std::int64_t cols, Matrix& m) {
  const core::Strides4& st = op.strides;
  if (op.dtype == DType::kF32 && st.col == 1 && (st.row >= cols || rows == 1) &&
      st.row <= std::numeric_limits<int>::max()) {
    m.data = static_cast<const float*>(op.data) + st.at(b, h, 0, 0);
    m.ld = static_cast<int>(std::max<std::int64_t>(st.row, cols));
    return;
  }
  m.copy.resize(static_cast<std::size_t>(rows * cols));
  fused::pack_rows(op, b, h, 0, rows, cols, m.copy.data(), cols);
  m.data = m.copy.data();
  m.ld = static_cast<int>(cols);
}

class BlasThreads {
 public:
  explicit BlasThreads(int threads) {
    if (openblas_set_num_threads == nullptr) return;
    previous_ = openblas_get_num_threads != nullptr ? openblas_get_num_threads() : 0;
    openblas_set_num_threads(threads);
  }
  ~BlasThreads() {
    if (openblas_set_num_threads != nullptr && previous_ > 0) openblas_set_num_threads(previous_);
  }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;

 private:
  int previous_ = 0;
};

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

std::string attention_fwd_unfused_blas_declines(const core::AttentionParams& p) {
  const core::AttentionShape& s = p.shape;
  const double bytes = 4.0 * static_cast<double>(s.nq) * static_cast<double>(s.nk);
  if (bytes > kWorkspaceBudgetBytes) {
    return "its nq x nk score matrix would need " + std::to_string(bytes / (1 << 30)) +
           " GiB (budget 2 GiB)";
  }
  const std::int64_t int_max = std::numeric_limits<int>::max();
  if (s.nq > int_max || s.nk > int_max || s.d > int_max || s.dv > int_max) {
    return "a dimension exceeds CBLAS's int range";
  }
  return float32_declines(p);
}

void attention_fwd_unfused_blas(const core::AttentionParams& p) noexcept {
  const core::AttentionShape& sh = p.shape;
  const int nq = static_cast<int>(sh.nq);
  const int nk = static_cast<int>(sh.nk);
  const int d = static_cast<int>(sh.d);
  const int dv = static_cast<int>(sh.dv);
  const float scale = static_cast<float>(p.scale);
  const bool masked = p.masking.has_structure() || p.masking.mask != nullptr;

  BlasThreads blas_threads(p.threads);
  std::vector<float> scores(static_cast<std::size_t>(sh.nq * sh.nk));
  std::vector<float> out(static_cast<std::size_t>(sh.nq * sh.dv));
  std::vector<float> row_max(static_cast<std::size_t>(sh.nq));
  std::vector<float> row_sum(static_cast<std::size_t>(sh.nq));
  Matrix q, k, v;
  for (std::int64_t b = 0; b < sh.b; ++b) {
    for (std::int64_t h = 0; h < sh.h; ++h) {
      const std::int64_t hk = h / sh.group();
      view_or_pack(p.q, b, h, sh.nq, sh.d, q);
      view_or_pack(p.k, b, hk, sh.nk, sh.d, k);
      view_or_pack(p.v, b, hk, sh.nk, sh.dv, v);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, d, scale, q.data, q.ld,
                  k.data, k.ld, 0.0f, scores.data(), nk);
      core::parallel_for(sh.nq, p.threads, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; masked && i < end; ++i) {
          // -inf outside the row's causal/window interval, the mask's bias inside it.
          const std::int64_t at = i * sh.nk;
          const core::KeyRange r =
              core::allowed_key_range(p.masking, sh.nk, i + sh.diagonal_offset());
          std::fill(scores.data() + at, scores.data() + at + r.first, -fused::kInfF);
          std::fill(scores.data() + at + r.last, scores.data() + at + sh.nk, -fused::kInfF);
          for (std::int64_t j = r.first; p.masking.mask != nullptr && j < r.last; ++j) {
            const float bias = static_cast<float>(core::mask_bias(p.masking, b, h, i, j));
            float& x = scores[static_cast<std::size_t>(at + j)];
            x = bias == -fused::kInfF ? -fused::kInfF : x + bias;
          }
        }
        softmax_rows(scores.data() + begin * sh.nk, sh.nk, sh.nk, end - begin,
                     row_max.data() + begin, row_sum.data() + begin);
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, dv, nk, 1.0f, scores.data(), nk,
                  v.data, v.ld, 0.0f, out.data(), dv);
      for (std::int64_t i = 0; i < sh.nq; ++i) {
        fused::store_row(p.out, b, h, i, 0, out.data() + i * sh.dv, sh.dv, 1.0f);
        if (p.weights.data != nullptr) {
          fused::store_row(p.weights, b, h, i, 0, scores.data() + i * sh.nk, sh.nk, 1.0f);
        }
        if (p.lse.data != nullptr) {
          const float m = row_max[static_cast<std::size_t>(i)];
          const double lse = finish(SoftmaxState{m, row_sum[static_cast<std::size_t>(i)]}).lse;
          core::store_real(p.lse.data, p.lse.dtype, p.lse.strides.at(b, h, i, 0), lse);
        }
      }
    }
  }
}

}  // namespace qkv::kernels
