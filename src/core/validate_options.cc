// The version 2 options of an attention call, checked (validate.h): the storage type, the score
// modifiers (softcap, ALiBi, sinks) and a packed batch's offsets, and the params of each of
// its sequences.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/mask_rule.h"
#include "core/score_modifiers.h"
#include "core/validate.h"
#include "qkv/error.h"

namespace qkv::core {
namespace {

std::string str(std::int64_t n) { return std::to_string(n); }

// One value per query head (ALiBi slopes, sinks): a finite real vector of shape [heads].
std::vector<double> per_head_values(const TensorView& view, std::int64_t heads,
                                    const std::string& what) {
  require_view_consistent(view);
  if (view.dtype != DType::kF32 && view.dtype != DType::kF64 && view.dtype != DType::kBF16 &&
      view.dtype != DType::kF16) {
    throw Error(view.name, what + " must be float, got " + dtype_name(view.dtype));
  }
  if (view.rank() != 1 || view.shape[0] != heads) {
    throw Error(view.name, what + " must have shape [" + str(heads) +
                               "] (one per query head), got " + shape_string(view.shape));
  }
  std::vector<double> values;
  for (std::int64_t h = 0; h < heads; ++h) {
    const double value = load_real(view.data, view.dtype, h * view.strides[0]);
    if (!std::isfinite(value)) {
      throw Error(view.name, what + " hold " + (std::isnan(value) ? "NaN" : "an infinity") +
                                 " at [" + str(h) + "] (they must be finite)");
    }
    values.push_back(value);
  }
  return values;
}

}  // namespace

// The storage type of a call, checked and set in p: options.dtype when given, else the type Q,
// K and V share when it is f64, bf16 or f16 (float64 inputs are computed in float64 unless the
// caller opts into float32), else f32 (mixed inputs, or all float32). The one place this rule
// lives: the CLI's --dtype only fills options.dtype.
void apply_storage_type(const AttentionOptions& options, AttentionParams& p) {
  if (options.dtype) {
    const DType d = *options.dtype;
    if (d != DType::kF64 && d != DType::kF32 && d != DType::kBF16 && d != DType::kF16) {
      throw Error("dtype", std::string("must be f64, f32, bf16 or f16, got ") + dtype_name(d));
    }
    p.compute = d;
  } else if (p.q.dtype == p.k.dtype && p.k.dtype == p.v.dtype &&
             (p.q.dtype == DType::kF64 || p.q.dtype == DType::kBF16 ||
              p.q.dtype == DType::kF16)) {
    p.compute = p.q.dtype;
  }
}

void apply_score_modifiers(const AttentionOptions& options, AttentionParams& p) {
  if (options.softcap) {
    const double cap = *options.softcap;
    if (!std::isfinite(cap) || cap <= 0) {
      throw Error("softcap", "must be a finite number > 0, got " + std::to_string(cap));
    }
    p.modifiers.softcap = cap;
  }
  const std::int64_t heads = p.shape.h;
  if (options.alibi && options.alibi_slopes) {
    throw Error("alibi", "give the standard slopes (alibi) or explicit ones (alibi_slopes), "
                         "not both");
  }
  if (options.alibi) p.modifiers.alibi_slopes = standard_alibi_slopes(heads);
  if (options.alibi_slopes) {
    p.modifiers.alibi_slopes = per_head_values(*options.alibi_slopes, heads, "ALiBi slopes");
  }
  if (options.sinks) {
    p.modifiers.sinks = per_head_values(*options.sinks, heads, "sinks");
    for (const double sink : p.modifiers.sinks) {
      p.magnitudes.sink = std::max(p.magnitudes.sink, std::abs(sink));
    }
  }
  apply_dropout(options, p);
}

void apply_dropout(const AttentionOptions& options, AttentionParams& p) {
  const double rate = options.dropout_p;
  if (!(rate >= 0.0 && rate < 1.0)) {
    throw Error("dropout_p", "must be in [0, 1), got " + std::to_string(rate));
  }
  p.dropout = Dropout{};
  if (rate == 0.0) return;
  // t = round(p·2^16), at least 1 (a p > 0 always drops something) and at most 2^16 - 1.
  const double t = std::clamp(std::nearbyint(rate * 65536.0), 1.0, 65535.0);
  // The counter holds rows, key blocks and b·H + h in 32 bits each.
  constexpr std::int64_t kWord = std::int64_t{1} << 32;
  const AttentionShape& s = p.shape;
  if (s.nq >= kWord || s.nk >= kWord || s.b * s.h >= kWord) {
    throw Error("dropout_p", "dropout draws over at most 2^32 - 1 rows, keys and batch·heads, got "
                             "B·H = " + str(s.b * s.h) + ", Nq = " + str(s.nq) + ", Nk = " +
                             str(s.nk));
  }
  p.dropout.threshold = static_cast<std::uint32_t>(t);
  p.dropout.keep_scale = 65536.0 / (65536.0 - t);
  p.dropout.seed = options.seed;
  p.dropout.offset = options.dropout_offset;
  p.dropout.heads = s.h;
}

namespace {

// The B+1 offsets of a packed batch's side with `rows` rows (`of` names the tensor they cut).
std::vector<std::int64_t> sequence_offsets(const TensorView& view, std::int64_t rows,
                                           const std::string& role, const std::string& of) {
  require_view_consistent(view);
  if (view.dtype != DType::kI32 && view.dtype != DType::kI64) {
    throw Error(view.name, role + " must hold int32 or int64 offsets, got " +
                               dtype_name(view.dtype));
  }
  if (view.rank() != 1 || view.shape[0] < 1) {
    throw Error(view.name, role + " must have shape [B+1] (B >= 0 sequences), got " +
                               shape_string(view.shape));
  }
  std::vector<std::int64_t> offsets;
  for (std::int64_t x = 0; x < view.shape[0]; ++x) {
    const std::int64_t at = x * view.strides[0];
    const std::int64_t value = view.dtype == DType::kI32
                                   ? static_cast<const std::int32_t*>(view.data)[at]
                                   : static_cast<const std::int64_t*>(view.data)[at];
    if (x == 0 && value != 0) {
      throw Error(view.name, role + " must start at 0, got " + str(value));
    }
    if (x > 0 && value < offsets.back()) {
      throw Error(view.name, role + " must be non-decreasing, got " + str(offsets.back()) +
                                 " then " + str(value) + " at [" + str(x) + "]");
    }
    offsets.push_back(value);
  }
  if (offsets.back() != rows) {
    throw Error(view.name, role + " must end at " + of + "'s " + str(rows) +
                               " rows, got " + str(offsets.back()));
  }
  return offsets;
}

}  // namespace

AttentionParams sequence_params(const AttentionCall& call, std::size_t s) {
  AttentionParams p = call.params;
  p.dropout.batch_base = static_cast<std::int64_t>(s);
  const std::int64_t q0 = call.cu_q[s];
  const std::int64_t k0 = call.cu_k[s];
  p.shape.nq = call.cu_q[s + 1] - q0;
  p.shape.nk = call.cu_k[s + 1] - k0;
  const auto advance = [](const void* data, DType dtype, std::int64_t elements) {
    return static_cast<const void*>(static_cast<const char*>(data) +
                                    elements * static_cast<std::int64_t>(dtype_size(dtype)));
  };
  const auto advance_out = [&](OutputOperand& o, std::int64_t rows) {
    if (o.data == nullptr) return;
    o.data = const_cast<void*>(advance(o.data, o.dtype, rows * o.strides.row));
  };
  if (p.shape.nq > 0) {
    p.q.data = advance(p.q.data, p.q.dtype, q0 * p.q.strides.row);
  }
  if (p.shape.nk > 0) {
    p.k.data = advance(p.k.data, p.k.dtype, k0 * p.k.strides.row);
    p.v.data = advance(p.v.data, p.v.dtype, k0 * p.v.strides.row);
  }
  if (p.shape.nq > 0) {
    advance_out(p.out, q0);
    advance_out(p.lse, q0);
  }
  return p;
}

void apply_packed_batch(const AttentionOptions& options, const TensorView& q, const TensorView& k,
                        AttentionCall& call) {
  if (options.cu_seqlens_q.has_value() != options.cu_seqlens_k.has_value()) {
    throw Error(options.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q",
                "is needed too: a packed batch gives the offsets of both sides");
  }
  if (options.cu_seqlens_q) {
    if (q.rank() == 4) {
      throw Error(q.name, "a packed batch (cu_seqlens) takes Q as [H, total_q, D] or "
                          "[total_q, D], got " + shape_string(q.shape));
    }
    if (options.mask) {
      throw Error("mask", "cannot be combined with a packed batch (cu_seqlens)");
    }
    if (options.return_weights) {
      throw Error("return_weights", "the weights output cannot be combined with a packed "
                                    "batch (cu_seqlens)");
    }
    const AttentionShape& shape = call.params.shape;
    call.cu_q = sequence_offsets(*options.cu_seqlens_q, shape.nq, "cu_seqlens_q", q.name);
    call.cu_k = sequence_offsets(*options.cu_seqlens_k, shape.nk, "cu_seqlens_k", k.name);
    if (call.cu_q.size() != call.cu_k.size()) {
      throw Error(options.cu_seqlens_k->name,
                  "cu_seqlens_k has " + str(static_cast<std::int64_t>(call.cu_k.size())) +
                      " offsets but cu_seqlens_q has " +
                      str(static_cast<std::int64_t>(call.cu_q.size())) + " (both B+1)");
    }
  }
}

}  // namespace qkv::core
