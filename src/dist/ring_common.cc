// What the ring's forward and backward share (ring_common.h).
#include "dist/ring_common.h"

#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <tuple>

#include "core/mask_rule.h"
#include "core/validate.h"
#include "dist/mpi_comm.h"

namespace qkv::dist::detail {

void apply_mask(const TensorView& q, const TensorView& k, const TensorView& v,
                const AttentionOptions& options, std::int64_t nk, core::AttentionParams& base) {
  static const double kZero = 0.0;  // zero in every input dtype
  const auto nothing = [&](const TensorView& t) {
    TensorView z{&kZero, t.dtype, t.shape, Shape(t.shape.size(), 0), t.name};
    z.shape[z.shape.size() - 2] = nk;
    return z;
  };
  AttentionOptions checked = options;
  checked.threads = 1;
  const core::AttentionCall call = core::validate_attention(q, nothing(k), nothing(v), checked);
  base.masking.mask = call.params.masking.mask;
  base.masking.mask_dtype = call.params.masking.mask_dtype;
  base.masking.mask_strides = call.params.masking.mask_strides;
  base.magnitudes.mask = call.params.magnitudes.mask;
}

namespace {

// What every rank must agree on: Q's rank, the heads and dims, the dtypes, the compute type.
std::array<std::int64_t, 10> call_signature(const TensorView& q, const TensorView& k,
                                            const TensorView& v, const core::AttentionParams& p) {
  const core::AttentionShape& s = p.shape;
  return {q.rank(),
          s.b,
          s.h,
          s.hkv,
          s.d,
          s.dv,
          static_cast<std::int64_t>(q.dtype),
          static_cast<std::int64_t>(k.dtype),
          static_cast<std::int64_t>(v.dtype),
          static_cast<std::int64_t>(p.compute)};
}

}  // namespace

std::array<std::int64_t, 2> agree_on_shapes(const TensorView& q, const TensorView& k,
                                            const TensorView& v, const core::AttentionParams& p,
                                            const Communicator& comm, RowLayout layout) {
  const MPI_Comm c = mpi_comm(comm);
  const int ranks = comm.size();
  const int me = comm.rank();
  std::string problem;
  // Shapes and dtypes must agree with rank 0's, and the rows with the layout.
  const std::array<std::int64_t, 10> mine = call_signature(q, k, v, p);
  std::array<std::int64_t, 10> root = mine;
  bounded_bcast(root.data(), static_cast<int>(root.size()), MPI_INT64_T, 0, c,
                "rank 0's shapes and dtypes");
  if (mine != root) {
    problem = "its Q " + shape_string(q.shape) + " (" + dtype_name(q.dtype) + "), K " +
              shape_string(k.shape) + ", V " + shape_string(v.shape) +
              " disagree with rank 0's in rank, heads, head dims or dtypes";
  }
  agree(comm, problem);
  const std::array<std::int64_t, 2> local = {q.dim(-2), k.dim(-2)};
  std::vector<std::int64_t> counts(2 * static_cast<std::size_t>(ranks));
  bounded_allgather(local.data(), 2, MPI_INT64_T, counts.data(), c, "every rank's row counts");
  std::array<std::int64_t, 2> total = {0, 0};
  for (std::size_t r = 0; r < counts.size(); r += 2) {
    total[0] += counts[r];
    total[1] += counts[r + 1];
  }
  for (const auto& [name, rows, all] :
       {std::tuple{q.name, local[0], total[0]}, std::tuple{k.name, local[1], total[1]}}) {
    const std::int64_t expected = rank_row_count(all, ranks, me, layout);
    if (rows != expected && problem.empty()) {
      problem = name + ": holds " + std::to_string(rows) + " rows; the " + layout_name(layout) +
                " layout gives this rank " + std::to_string(expected) + " of " +
                std::to_string(all) + " over " + std::to_string(ranks) + " ranks";
    }
  }
  agree(comm, problem);
  return total;
}

namespace {

// The shortest decimal that reads back as `x`: equal text, equal bits.
std::string number(double x) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof text, x);
  return error == std::errc() ? std::string(text, end) : "?";
}

// A few values in full; more (the slopes or sinks of many heads) as their count and a hash of
// their bits, enough to tell two ranks' apart.
std::string numbers(const std::vector<double>& values) {
  if (values.empty()) return "none";
  if (values.size() > 8) {
    std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
    for (const double v : values) {
      std::uint64_t bits = 0;
      std::memcpy(&bits, &v, sizeof bits);
      for (int byte = 0; byte < 8; ++byte) {
        hash = (hash ^ ((bits >> (8 * byte)) & 0xff)) * 1099511628211ull;
      }
    }
    char text[64];
    std::snprintf(text, sizeof text, "%zu values hashing to %016llx", values.size(),
                  static_cast<unsigned long long>(hash));
    return text;
  }
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + number(values[i]);
  return text + "]";
}

}  // namespace

std::vector<Setting> ring_settings(const AttentionOptions& options, const core::AttentionParams& p,
                                   RowLayout layout, bool forward) {
  const core::Masking& m = p.masking;
  std::string mask = "none";
  if (options.mask) {
    const Shape& shape = options.mask->shape;
    std::string dims = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) {
      const bool rows = i + 2 == shape.size();
      dims += (i ? ", " : "") + (rows ? std::string("rows") : std::to_string(shape[i]));
    }
    mask = std::string(dtype_name(options.mask->dtype)) + " " + dims + "]";
  }
  std::vector<Setting> settings = {
      {"causal", m.causal ? "true" : "false"},
      {"window", "(" + std::to_string(m.window_left) + ", " + std::to_string(m.window_right) + ")"},
      {"scale", number(p.scale)},
      {"softcap", p.modifiers.softcap > 0 ? number(p.modifiers.softcap) : "none"},
      {"alibi_slopes", numbers(p.modifiers.alibi_slopes)},
      {"sinks", numbers(p.modifiers.sinks)},
      {"mask", mask},
      {"dtype", dtype_name(p.compute)},
      {"out_dtype", dtype_name(options.out_dtype)},
      {"kernel", options.kernel.empty() ? "(the fastest)" : options.kernel},
      {"layout", layout_name(layout)},
  };
  if (forward) settings.push_back({"return_lse", options.return_lse ? "true" : "false"});
  return settings;
}

bool visible(const core::Masking& m, std::int64_t nq, std::int64_t nk, const RowRange& q,
             const RowRange& k) {
  if (!m.has_structure()) return true;
  const std::int64_t shift = nk - nq;
  const std::int64_t first = core::allowed_key_range(m, nk, q.first + shift).first;
  const std::int64_t last = core::allowed_key_range(m, nk, q.last - 1 + shift).last;
  return std::max(first, k.first) < std::min(last, k.last);
}

void pack_block(const BlockGeometry& g, const TensorView& k, const TensorView& v, char* at) {
  const auto put = [&](const TensorView& t, char* to) {
    const std::size_t bytes =
        static_cast<std::size_t>(t.numel()) * static_cast<std::size_t>(dtype_size(t.dtype));
    if (bytes == 0) return;
    if (t.is_contiguous()) {
      std::memcpy(to, t.data, bytes);
    } else {
      const Tensor copy = contiguous_copy(t, t.dtype);
      std::memcpy(to, copy.data(), bytes);
    }
  };
  const std::int64_t rows = k.dim(-2);
  put(k, at);
  const auto k_end = static_cast<std::size_t>(g.k_bytes(rows));
  std::memset(at + k_end, 0, static_cast<std::size_t>(g.v_at(rows)) - k_end);
  put(v, at + g.v_at(rows));
}

void point_at_block(const BlockGeometry& g, const char* block, std::int64_t rows,
                    std::int64_t first, core::InputOperand& k, core::InputOperand& v) {
  k.data = block + first * g.d * g.k_elem;
  k.strides = core::Strides4{rows * g.d * g.hkv, rows * g.d, g.d, 1};
  v.data = block + g.v_at(rows) + first * g.dv * g.v_elem;
  v.strides = core::Strides4{rows * g.dv * g.hkv, rows * g.dv, g.dv, 1};
}

Tensor widened_input(const TensorView& t) {
  if (t.dtype == DType::kF32) return contiguous_copy(t, DType::kF64);
  return contiguous_copy(contiguous_copy(t, DType::kF32).view(), DType::kF64);
}

}  // namespace qkv::dist::detail
