// qkv demo: the seed's own setting on a built-in example, every intermediate printed.
#include <cstdio>
#include <string>

#include "commands.h"
#include "qkv/attention.h"
#include "qkv/layer.h"

namespace qkv::cli {
namespace {

// Four samples (one per row) of width 3, and projections to d_q = d_k = d_v = 2.
constexpr double kX[4][3] = {{1, 0, 1}, {0, 2, 0}, {1, 1, 1}, {0, 1, 2}};
constexpr double kWq[3][2] = {{1, 0}, {0, 1}, {1, 1}};
constexpr double kWk[3][2] = {{0, 1}, {1, 0}, {1, 1}};
constexpr double kWv[3][2] = {{1, 2}, {0, 1}, {2, 0}};

template <std::size_t R, std::size_t C>
TensorView view_of(const double (&m)[R][C], const char* name) {
  return TensorView{m, DType::kF64, {static_cast<std::int64_t>(R), static_cast<std::int64_t>(C)},
                    {static_cast<std::int64_t>(C), 1}, name};
}

void print_matrix(const char* title, const Tensor& m) {
  std::printf("%s  %s\n", title, shape_string(m.shape()).c_str());
  const Tensor values = m.to(DType::kF64);
  const std::int64_t cols = m.shape().back();
  for (std::int64_t r = 0; r < m.numel() / cols; ++r) {
    std::printf("  row %lld:", static_cast<long long>(r));
    for (std::int64_t c = 0; c < cols; ++c) std::printf(" %9.4f", values.data_as<double>()[r * cols + c]);
    std::printf("\n");
  }
  std::printf("\n");
}

void run_demo() {
  const TensorView x = view_of(kX, "X");
  const Tensor q = linear(x, view_of(kWq, "W^Q"));
  const Tensor k = linear(x, view_of(kWk, "W^K"));
  const Tensor v = linear(x, view_of(kWv, "W^V"));
  std::printf("The seed's self-attention on 4 samples of width 3 (one sample per row).\n\n");
  print_matrix("X", contiguous_copy(x, DType::kF64));
  print_matrix("Q = X·W^Q", q);
  print_matrix("K = X·W^K", k);
  print_matrix("V = X·W^V  (W^V, not W^K: keys and values are two transforms of the same rows)", v);

  // r_i = q_i·K^T: K^T is a view of K with its strides swapped.
  TensorView k_transposed = k.view();
  k_transposed.shape = {k.shape()[1], k.shape()[0]};
  k_transposed.strides = {1, k.shape()[1]};
  print_matrix("r = Q·K^T  (row i: how sample i relates to every sample)",
               linear(q.view(), k_transposed));

  AttentionOptions options;
  options.return_weights = true;
  options.out_dtype = DType::kF64;
  const AttentionResult result = attention(q.view(), k.view(), v.view(), options);
  print_matrix("weights = softmax(r / sqrt(d_k))  (row i: where sample i attends; rows sum to 1)",
               result.weights);
  print_matrix("O = weights·V  (row i: the weighted sum of all values)", result.out);
}

}  // namespace

void register_demo_command(CLI::App& app) {
  CLI::App* sub =
      app.add_subcommand("demo", "the seed's example: X, Q, K, V, the weights and O, printed");
  sub->footer("Example:\n  qkv demo");
  sub->callback([] { run_demo(); });
}

}  // namespace qkv::cli
