// Reading the projection weights of qkv layer and qkv explain.
#include "layer_weights.h"

#include "cli_common.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::cli {
namespace {

// A weight matrix; with --linear-layout, stored [out, in] and transposed here to [in, out].
std::optional<Tensor> read_weight(const std::string& spec, bool linear_layout) {
  if (spec.empty()) return std::nullopt;
  Tensor w = read_input(spec);
  if (!linear_layout) return w;
  if (w.shape().size() != 2) {
    throw Error(spec, "expected a 2-D weight [out, in] (--linear-layout), got " +
                          std::to_string(w.shape().size()) + " dims " + shape_string(w.shape()));
  }
  TensorView transposed = w.view();
  transposed.shape = {w.shape()[1], w.shape()[0]};
  transposed.strides = {1, w.shape()[1]};
  Tensor copy = contiguous_copy(transposed, w.dtype());
  return Tensor(std::move(copy));
}

// Columns [begin, begin + width) of a matrix, or entries of a vector: a view, no copy.
TensorView column_block(const Tensor& t, std::int64_t begin, std::int64_t width,
                        const std::string& name) {
  TensorView view = t.view();
  const auto offset = static_cast<std::size_t>(begin) * dtype_size(t.dtype());
  view.data = static_cast<const char*>(t.data()) + offset;
  view.shape.back() = width;
  view.name = name;
  return view;
}

struct FusedSplit {
  TensorView q, k, v;
};

// Splits a fused [.., (H + 2·Hkv)·dk] weight or bias into its Q, K and V blocks.
FusedSplit split_fused(const Tensor& fused, const std::string& spec, std::int64_t heads,
                       std::int64_t kv_heads) {
  const Shape& shape = fused.shape();
  if (shape.empty() || shape.size() > 2) {
    throw Error(spec,
                "expected a fused weight [d, 3·H·dk] or bias [3·H·dk], got " + shape_string(shape));
  }
  const std::int64_t width = shape.back();
  const std::int64_t parts = heads + 2 * kv_heads;
  if (width == 0 || width % parts != 0) {
    throw Error(spec, "has " + std::to_string(width) +
                          " columns, which do not split into Q, K and V of " +
                          std::to_string(heads) + " + 2 x " + std::to_string(kv_heads) +
                          " heads of equal width");
  }
  const std::int64_t dk = width / parts;
  const auto block = [&](std::int64_t begin, std::int64_t w, const char* part) {
    return column_block(
        fused, begin, w,
        spec + "[" + part + ": " + std::to_string(begin) + ":" + std::to_string(begin + w) + "]");
  };
  return {block(0, heads * dk, "Q"), block(heads * dk, kv_heads * dk, "K"),
          block((heads + kv_heads) * dk, kv_heads * dk, "V")};
}

}  // namespace

void add_weight_flags(CLI::App& command, WeightFlags& flags, bool heads_required) {
  command.add_option("--wq", flags.wq, "W^Q [d, H·dk] (X·W convention)");
  command.add_option("--wk", flags.wk, "W^K [d_m, Hkv·dk]");
  command.add_option("--wv", flags.wv, "W^V [d_m, Hkv·dv]");
  command.add_option("--wqkv", flags.wqkv,
                     "fused W^Q|W^K|W^V [d, (H + 2·Hkv)·dk] (GPT-2's c_attn), split into column "
                     "blocks; instead of --wq, --wk, --wv");
  flags.heads_option =
      command
          .add_option("--heads", flags.heads,
                      heads_required ? "query heads H (contiguous column blocks)"
                                     : "query heads H (contiguous column blocks); required with "
                                       "the weights")
          ->check(at_least(1));
  if (heads_required) flags.heads_option->required();
  command.add_option("--kv-heads", flags.kv_heads, "key/value heads Hkv (default H)")
      ->check(at_least(1));
  command.add_option("--wo", flags.wo, "output projection W^O [H·dv, d_out]");
  command.add_option("--bq", flags.bq, "bias of Q [H·dk]");
  command.add_option("--bk", flags.bk, "bias of K [Hkv·dk]");
  command.add_option("--bv", flags.bv, "bias of V [Hkv·dv]");
  command.add_option("--bqkv", flags.bqkv, "fused bias of Q|K|V [(H + 2·Hkv)·dk]");
  command.add_option("--bo", flags.bo, "bias of the output [d_out] (needs --wo)");
  command.add_flag("--linear-layout", flags.linear_layout,
                   "weight matrices are stored as nn.Linear weights [out, in] (BERT, PyTorch): "
                   "transpose them on load");
}

bool any_weight(const WeightFlags& f) {
  for (const std::string& spec : weight_specs(f)) {
    if (!spec.empty()) return true;
  }
  return false;
}

std::vector<std::string> weight_specs(const WeightFlags& f) {
  return {f.wqkv, f.wq, f.wk, f.wv, f.wo, f.bqkv, f.bq, f.bk, f.bv, f.bo};
}

void check_weight_flags(const WeightFlags& f) {
  const bool fused = !f.wqkv.empty();
  const bool separate = !f.wq.empty() || !f.wk.empty() || !f.wv.empty();
  if (fused && separate) {
    throw Error("--wqkv", "gives W^Q, W^K and W^V together; drop --wq, --wk and --wv");
  }
  if (!fused && (f.wq.empty() || f.wk.empty() || f.wv.empty())) {
    throw Error(f.wq.empty()   ? "--wq"
                : f.wk.empty() ? "--wk"
                               : "--wv",
                "is required (or give the fused projection with --wqkv)");
  }
  if (!f.bqkv.empty() && (!f.bq.empty() || !f.bk.empty() || !f.bv.empty())) {
    throw Error("--bqkv", "gives the Q, K and V biases together; drop --bq, --bk and --bv");
  }
  if (!f.bo.empty() && f.wo.empty()) {
    throw Error(f.bo, "an output bias needs an output projection (--wo)");
  }
}

void load_weights(const WeightFlags& f, LoadedWeights& out) {
  check_weight_flags(f);
  const bool fused = !f.wqkv.empty();
  const std::int64_t kv_heads = f.kv_heads == 0 ? f.heads : f.kv_heads;
  out.wqkv = read_weight(f.wqkv, f.linear_layout);
  out.wq = read_weight(f.wq, f.linear_layout);
  out.wk = read_weight(f.wk, f.linear_layout);
  out.wv = read_weight(f.wv, f.linear_layout);
  out.wo = read_weight(f.wo, f.linear_layout);
  out.bqkv = read_optional(f.bqkv);
  out.bq = read_optional(f.bq);
  out.bk = read_optional(f.bk);
  out.bv = read_optional(f.bv);
  out.bo = read_optional(f.bo);

  LayerWeights& weights = out.weights;
  if (fused) {
    const FusedSplit split = split_fused(*out.wqkv, f.wqkv, f.heads, kv_heads);
    weights.wq = split.q;
    weights.wk = split.k;
    weights.wv = split.v;
  } else {
    weights.wq = out.wq->view();
    weights.wk = out.wk->view();
    weights.wv = out.wv->view();
  }
  if (out.bqkv) {
    if (out.bqkv->shape().size() != 1) {
      throw Error(f.bqkv, "expected a 1-D fused bias [3·H·dk], got " +
                              shape_string(out.bqkv->shape()));
    }
    const FusedSplit split = split_fused(*out.bqkv, f.bqkv, f.heads, kv_heads);
    weights.bq = split.q;
    weights.bk = split.k;
    weights.bv = split.v;
  } else {
    weights.bq = view_of(out.bq);
    weights.bk = view_of(out.bk);
    weights.bv = view_of(out.bv);
  }
  weights.wo = view_of(out.wo);
  weights.bo = view_of(out.bo);
}

}  // namespace qkv::cli
