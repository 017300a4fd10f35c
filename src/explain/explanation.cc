// Building an Explanation: run the library exactly as `qkv attention` / `qkv layer` would, ask
// attention() for the lse in float64, and keep float64 copies of one batch element's Q, K, V,
// O and lse, head by head.
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/mask_rule.h"
#include "core/score_modifiers.h"
#include "core/validate.h"
#include "explain/mask_rule.h"
#include "qkv/error.h"
#include "qkv/explain.h"

namespace qkv {
namespace {

std::string str(std::int64_t n) { return std::to_string(n); }

// Copies rows x cols elements of a [b, h, row, col]-strided operand into a Matrix, rounded to
// the call's storage type as the kernels read them.
Matrix gather(const core::InputOperand& op, DType compute, std::int64_t b, std::int64_t h,
              std::int64_t rows, std::int64_t cols) {
  Matrix m{rows, cols, std::vector<double>(static_cast<std::size_t>(rows * cols))};
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t c = 0; c < cols; ++c) {
      m.values[static_cast<std::size_t>(i * cols + c)] = core::round_to_storage(
          core::load_real(op.data, op.dtype, op.strides.at(b, h, i, c)), compute);
    }
  }
  return m;
}

std::vector<std::string> labels_or_numbers(const std::vector<std::string>& given,
                                           std::int64_t count, const std::string& subject,
                                           const std::string& rows_of) {
  if (given.empty()) {
    std::vector<std::string> numbers;
    for (std::int64_t i = 0; i < count; ++i) numbers.push_back(str(i));
    return numbers;
  }
  if (static_cast<std::int64_t>(given.size()) != count) {
    throw Error(subject, "has " + str(static_cast<std::int64_t>(given.size())) + " labels but " +
                             rows_of + " has " + str(count) + " rows");
  }
  return given;
}

// Coordinate labels: none, or exactly `count` of them.
std::vector<std::string> coordinate_labels(const std::vector<std::string>& given,
                                           std::int64_t count, const std::string& subject,
                                           const std::string& what) {
  if (!given.empty() && static_cast<std::int64_t>(given.size()) != count) {
    throw Error(subject, "has " + str(static_cast<std::int64_t>(given.size())) + " labels but " +
                             what + " has " + str(count));
  }
  return given;
}

// Runs attention() once as the caller asked, plus the lse in float64, and fills, for each batch
// element asked for, everything but the projection. `mask_owner` holds the copy of the mask
// that the options point at; the explanations share it.
std::vector<Explanation> run_and_collect(const TensorView& q, const TensorView& k,
                                         const TensorView& v, AttentionOptions options,
                                         Tensor mask_owner,
                                         const std::vector<std::int64_t>& batches,
                                         const ExplainSetup& setup) {
  if (options.cu_seqlens_q || options.cu_seqlens_k) {
    throw Error("cu_seqlens", "explain takes one sequence, not a packed batch: pass that "
                              "sequence's rows");
  }
  options.return_weights = false;
  options.return_lse = true;
  options.out_dtype = DType::kF64;
  const core::AttentionCall call = core::validate_attention(q, k, v, options);
  const core::AttentionParams& p = call.params;
  const core::AttentionShape& s = p.shape;
  for (const std::int64_t b : batches) {
    if (b < 0 || b >= s.b) {
      throw Error("batch", "index " + str(b) + " is outside the input's " + str(s.b) +
                               (s.b == 1 ? " batch element" : " batch elements"));
    }
  }
  const AttentionResult result = attention(q, k, v, options);
  const std::vector<std::string> query_labels =
      labels_or_numbers(setup.query_labels, s.nq, setup.query_labels_source, q.name);
  const std::vector<std::string> key_labels =
      labels_or_numbers(setup.key_labels, s.nk, setup.key_labels_source, k.name);
  const std::vector<std::string> d_labels = coordinate_labels(
      setup.d_labels, s.d, setup.d_labels_source, "d_k (the width of a query and a key)");
  const std::vector<std::string> dv_labels = coordinate_labels(
      setup.dv_labels, s.dv, setup.dv_labels_source, "d_v (the width of a value)");

  const auto shared_mask = std::make_shared<const Tensor>(std::move(mask_owner));
  std::vector<Explanation> parts;
  for (const std::int64_t b : batches) {
    Explanation& e = parts.emplace_back();
    e.title = setup.title;
    e.story = setup.story;
    e.nq = s.nq;
    e.nk = s.nk;
    e.d = s.d;
    e.dv = s.dv;
    e.heads = s.h;
    e.kv_heads = s.hkv;
    e.batch = b;
    e.batches = s.b;
    e.cross_attention = setup.cross_attention;
    e.scale = p.scale;
    e.causal = options.causal;
    e.window = options.window;
    e.softcap = p.modifiers.softcap;
    e.alibi_slopes = p.modifiers.alibi_slopes;
    e.sinks = p.modifiers.sinks;
    e.dtype = p.compute;
    e.kernel = result.kernel;
    e.threads = options.threads;
    e.query_labels = query_labels;
    e.key_labels = key_labels;
    e.d_labels = d_labels;
    e.dv_labels = dv_labels;
    for (std::int64_t h = 0; h < s.h; ++h) {
      e.q.push_back(gather(p.q, p.compute, b, h, s.nq, s.d));
      // The outputs are contiguous [.., H, nq, dv] and [.., H, nq] (B and H are 1 when absent).
      const std::int64_t head_row0 = (b * s.h + h) * s.nq;
      const double* out = result.out.data_as<double>() + head_row0 * s.dv;
      e.out.push_back(Matrix{s.nq, s.dv, std::vector<double>(out, out + s.nq * s.dv)});
      const double* lse = result.lse.data_as<double>() + head_row0;
      e.lse.emplace_back(lse, lse + s.nq);
    }
    for (std::int64_t h = 0; h < s.hkv; ++h) {
      e.k.push_back(gather(p.k, p.compute, b, h, s.nk, s.d));
      e.v.push_back(gather(p.v, p.compute, b, h, s.nk, s.dv));
    }
    auto rule = std::make_shared<explain_detail::MaskRule>();
    rule->masking = p.masking;
    rule->batch = b;
    rule->nq = s.nq;
    rule->nk = s.nk;
    if (options.mask) {
      e.mask_name = options.mask->name;
      e.mask_varies_by_head = p.masking.mask_strides.h != 0;
      rule->mask = shared_mask;  // the storage the masking's pointer points into
    }
    e.mask_rule = std::move(rule);
  }
  return parts;
}

// The mask copied into storage the explanation owns, and the options pointing at the copy.
Tensor own_mask(AttentionOptions& options) {
  if (!options.mask) return Tensor();
  Tensor copy = contiguous_copy(*options.mask, options.mask->dtype);
  TensorView view = copy.view();
  view.name = options.mask->name;
  options.mask = view;
  return copy;
}

// A [B, heads, N, width] view (or [heads, N, width]) of column blocks of [B·N, heads·width].
TensorView head_view(const Tensor& m, bool batched, std::int64_t batch, std::int64_t n,
                     std::int64_t heads, std::int64_t width, std::string name) {
  const std::int64_t row = heads * width;
  TensorView view{m.data(), m.dtype(), {}, {}, std::move(name)};
  if (batched) {
    view.shape = {batch, heads, n, width};
    view.strides = {n * row, width, row, 1};
  } else {
    view.shape = {heads, n, width};
    view.strides = {width, row, 1};
  }
  return view;
}

// Columns [first, first + count) of a 2-D weight, as a Matrix.
Matrix column_block(const TensorView& w, std::int64_t first, std::int64_t count) {
  const Tensor all = contiguous_copy(w, DType::kF64);
  const std::int64_t cols = w.dim(1);
  Matrix m{w.dim(0), count, std::vector<double>(static_cast<std::size_t>(w.dim(0) * count))};
  for (std::int64_t r = 0; r < m.rows; ++r) {
    for (std::int64_t c = 0; c < count; ++c) {
      m.values[static_cast<std::size_t>(r * count + c)] =
          all.data_as<double>()[r * cols + first + c];
    }
  }
  return m;
}

// Rows of batch element b of a [B, N, w] or [N, w] input, as a Matrix.
Matrix sample_rows(const TensorView& t, std::int64_t b) {
  const Tensor all = contiguous_copy(t, DType::kF64);
  const std::int64_t n = t.dim(-2), w = t.dim(-1);
  const double* first = all.data_as<double>() + b * n * w;
  return Matrix{n, w, std::vector<double>(first, first + n * w)};
}

}  // namespace

double Explanation::bias(std::int64_t head, std::int64_t i, std::int64_t j) const noexcept {
  const explain_detail::MaskRule& rule = *mask_rule;
  if (!core::structurally_allowed(rule.masking, i + nk - nq, j)) {
    return -std::numeric_limits<double>::infinity();
  }
  return core::mask_bias(rule.masking, rule.batch, head, i, j);
}

double Explanation::alibi(std::int64_t head, std::int64_t i, std::int64_t j) const noexcept {
  if (alibi_slopes.empty()) return 0.0;
  return core::alibi_bias(alibi_slopes[static_cast<std::size_t>(head)], i + nk - nq, j);
}

double Explanation::score(std::int64_t head, std::int64_t i, std::int64_t j,
                          double raw) const noexcept {
  const double b = bias(head, i, j);
  if (b == -std::numeric_limits<double>::infinity()) return b;
  return core::softcap(scale * raw, softcap) + alibi(head, i, j) + b;
}

std::vector<Explanation> explain_attention_batches(const TensorView& q, const TensorView& k,
                                                   const TensorView& v,
                                                   const AttentionOptions& options,
                                                   const std::vector<std::int64_t>& batches,
                                                   const ExplainSetup& setup) {
  AttentionOptions run = options;
  Tensor mask = own_mask(run);
  return run_and_collect(q, k, v, run, std::move(mask), batches, setup);
}

Explanation explain_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionOptions& options, const ExplainSetup& setup) {
  return std::move(explain_attention_batches(q, k, v, options, {setup.batch}, setup).front());
}

std::vector<Explanation> explain_layer_batches(const TensorView& x, const LayerWeights& weights,
                                               const LayerOptions& options,
                                               const std::optional<TensorView>& memory,
                                               const std::vector<std::int64_t>& batches,
                                               const ExplainSetup& setup) {
  if (x.rank() != 2 && x.rank() != 3) {
    throw Error(x.name, "expected [N, d] or [B, N, d] (one sample per row), got " + str(x.rank()) +
                            " dims " + shape_string(x.shape));
  }
  const TensorView& source = memory ? *memory : x;
  if (memory && memory->rank() != x.rank()) {
    throw Error(memory->name, "expected " + str(x.rank()) + " dims like " + x.name + ", got " +
                                  str(memory->rank()) + " " + shape_string(memory->shape));
  }
  const std::int64_t heads = options.heads;
  const std::int64_t kv_heads = options.kv_heads == 0 ? heads : options.kv_heads;
  if (heads < 1) throw Error("heads", "must be at least 1");
  if (kv_heads < 1 || heads % kv_heads != 0) {
    throw Error("kv-heads", str(kv_heads) + " kv heads do not divide " + str(heads) +
                                " query heads (H % Hkv must be 0)");
  }
  // The projections the layer makes, through the same linear().
  const int threads = options.attention.threads;
  const Tensor q = linear(x, weights.wq, weights.bq, threads);
  const Tensor k = linear(source, weights.wk, weights.bk, threads);
  const Tensor v = linear(source, weights.wv, weights.bv, threads);
  const std::int64_t q_width = q.shape().back(), k_width = k.shape().back();
  const std::int64_t v_width = v.shape().back();
  if (q_width % heads != 0) {
    throw Error(weights.wq.name, str(q_width) + " columns do not split into " + str(heads) +
                                     " heads of equal width");
  }
  const std::int64_t dk = q_width / heads;
  if (k_width != kv_heads * dk) {
    throw Error(weights.wk.name, "has " + str(k_width) + " columns, expected " + str(kv_heads) +
                                     " kv heads x dk " + str(dk) + " = " + str(kv_heads * dk) +
                                     " (dk from " + weights.wq.name + ")");
  }
  if (v_width % kv_heads != 0) {
    throw Error(weights.wv.name, str(v_width) + " columns do not split into " + str(kv_heads) +
                                     " kv heads of equal width");
  }
  const std::int64_t dv = v_width / kv_heads;
  const bool batched = x.rank() == 3;
  const std::int64_t batch = batched ? x.dim(0) : 1;
  if (batched && source.dim(0) != batch) {
    throw Error(source.name, "batch size " + str(source.dim(0)) + " differs from " + x.name +
                                 "'s " + str(batch));
  }
  const std::int64_t nq = x.dim(-2), nk = source.dim(-2);

  AttentionOptions run = options.attention;
  Tensor mask = own_mask(run);
  ExplainSetup layer_setup = setup;
  layer_setup.cross_attention = setup.cross_attention || memory.has_value();
  std::vector<Explanation> parts = run_and_collect(
      head_view(q, batched, batch, nq, heads, dk, "Q = " + x.name + "·" + weights.wq.name),
      head_view(k, batched, batch, nk, kv_heads, dk, "K = " + source.name + "·" + weights.wk.name),
      head_view(v, batched, batch, nk, kv_heads, dv, "V = " + source.name + "·" + weights.wv.name),
      run, std::move(mask), batches, layer_setup);
  const std::vector<std::string> sample_labels =
      coordinate_labels(setup.sample_labels, x.dim(-1), "sample labels", x.name + "'s width");
  const std::vector<std::string> memory_labels = coordinate_labels(
      memory ? setup.memory_labels : setup.sample_labels, source.dim(-1), "memory labels",
      source.name + "'s width");

  ExplainProjection projection;
  projection.x_name = x.name;
  projection.memory_name = source.name;
  const Tensor bq = weights.bq ? contiguous_copy(*weights.bq, DType::kF64) : Tensor();
  for (std::int64_t h = 0; h < heads; ++h) {
    projection.wq.push_back(column_block(weights.wq, h * dk, dk));
    if (!bq.empty()) {
      const double* first = bq.data_as<double>() + h * dk;
      projection.bq.emplace_back(first, first + dk);
    }
  }
  for (std::int64_t h = 0; h < kv_heads; ++h) {
    projection.wk.push_back(column_block(weights.wk, h * dk, dk));
    projection.wv.push_back(column_block(weights.wv, h * dv, dv));
  }
  for (Explanation& e : parts) {
    e.projection = projection;
    e.projection->x = sample_rows(x, e.batch);
    e.projection->memory = sample_rows(source, e.batch);
    e.sample_labels = sample_labels;
    e.memory_labels = memory_labels;
  }
  return parts;
}

Explanation explain_layer(const TensorView& x, const LayerWeights& weights,
                          const LayerOptions& options, const std::optional<TensorView>& memory,
                          const ExplainSetup& setup) {
  return std::move(explain_layer_batches(x, weights, options, memory, {setup.batch}, setup).front());
}

}  // namespace qkv
