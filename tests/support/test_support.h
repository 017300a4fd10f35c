// Helpers shared by the test suites: deterministic random tensors, comparisons, scratch folders.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::testing {

// Uniform in [lo, hi), reproducible from the seed.
Tensor random_tensor(DType dtype, const Shape& shape, std::uint64_t seed, double lo = -1.0,
                     double hi = 1.0);

// Element-wise max |a - b| over two views of the same shape (any dtype, any strides);
// +inf if the shapes differ or exactly one of a pair is NaN.
double max_abs_diff(const TensorView& a, const TensorView& b);
double max_abs(const TensorView& a);

// The same dtype, shape and bytes. Safe for empty tensors, whose data() may be null (memcmp
// must not see a null pointer, even for 0 bytes: UBSan stops the test there).
bool same_bytes(const Tensor& a, const Tensor& b);

// Element i (flat, C order) of any view as a double.
double element(const TensorView& view, std::int64_t flat_index);

// softmax(q·k / sqrt(D), causal, bottom-right aligned)·v written out in plain float64, for
// [H, Nq, D] q, [H, Nk, D] k and [H, Nk, Dv] v of any dtype (Nk >= Nq): what the CLI tests hold
// qkv's outputs against. out is [H, Nq, Dv] and lse [H, Nq], both flat in C order.
struct CausalAttention64 {
  std::vector<double> out, lse;
};
CausalAttention64 causal_attention_f64(const Tensor& q, const Tensor& k, const Tensor& v);

// max |a_i - b_i| over a flat float64 vector and a tensor of as many elements (any dtype).
double max_abs_diff(const std::vector<double>& a, const Tensor& b);

// A fresh folder under the system's temp dir, removed with everything in it on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const noexcept { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace qkv::testing
