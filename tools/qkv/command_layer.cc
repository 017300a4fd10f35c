// qkv layer: the seed's whole system, from X and the projection matrices.
//
// Weights may come from model files (FILE.safetensors:NAME) in the layouts checkpoints use:
// --linear-layout says the stored matrices are nn.Linear weights [out, in] (BERT, PyTorch), to
// be transposed on load; --wqkv gives a fused [d, (H + 2·Hkv)·dk] projection (GPT-2's c_attn)
// that is split into W^Q, W^K and W^V as column blocks, without a copy.
#include <memory>
#include <optional>

#include "cli_common.h"
#include "commands.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/layer.h"

namespace qkv::cli {
namespace {

struct LayerCommand {
  std::string x_path, wq_path, wk_path, wv_path, wo_path, wqkv_path, bqkv_path;
  std::string bq_path, bk_path, bv_path, bo_path, memory_path;
  std::int64_t heads = 1;
  std::int64_t kv_heads = 0;
  bool linear_layout = false;
  std::string out_path;
  AttentionFlags flags;
};

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
                          " columns, which do not split into Q, K "
                          "and V of " +
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

void run_layer(const LayerCommand& command) {
  const bool fused = !command.wqkv_path.empty();
  const bool separate =
      !command.wq_path.empty() || !command.wk_path.empty() || !command.wv_path.empty();
  if (fused && separate) {
    throw Error("--wqkv", "gives W^Q, W^K and W^V together; drop --wq, --wk and --wv");
  }
  if (!fused && (command.wq_path.empty() || command.wk_path.empty() || command.wv_path.empty())) {
    throw Error(command.wq_path.empty()   ? "--wq"
                : command.wk_path.empty() ? "--wk"
                                          : "--wv",
                "is required (or give the fused projection with --wqkv)");
  }
  if (!command.bqkv_path.empty() &&
      (!command.bq_path.empty() || !command.bk_path.empty() || !command.bv_path.empty())) {
    throw Error("--bqkv", "gives the Q, K and V biases together; drop --bq, --bk and --bv");
  }
  const std::int64_t kv_heads = command.kv_heads == 0 ? command.heads : command.kv_heads;

  const std::uint64_t input_bytes = check_input_sizes(
      command.flags, {command.x_path, command.wqkv_path, command.wq_path, command.wk_path,
                      command.wv_path, command.wo_path, command.bqkv_path, command.bq_path,
                      command.bk_path, command.bv_path, command.bo_path, command.memory_path});
  const std::optional<Tensor> x = read_optional(command.x_path);
  const std::optional<Tensor> wqkv = read_weight(command.wqkv_path, command.linear_layout);
  const std::optional<Tensor> wq = read_weight(command.wq_path, command.linear_layout);
  const std::optional<Tensor> wk = read_weight(command.wk_path, command.linear_layout);
  const std::optional<Tensor> wv = read_weight(command.wv_path, command.linear_layout);
  const std::optional<Tensor> wo = read_weight(command.wo_path, command.linear_layout);
  const std::optional<Tensor> bqkv = read_optional(command.bqkv_path);
  const std::optional<Tensor> bq = read_optional(command.bq_path);
  const std::optional<Tensor> bk = read_optional(command.bk_path);
  const std::optional<Tensor> bv = read_optional(command.bv_path);
  const std::optional<Tensor> bo = read_optional(command.bo_path);
  const std::optional<Tensor> memory = read_optional(command.memory_path);
  const AttentionTensors tensors = load_attention_tensors(command.flags);
  if (tensors.cu_seqlens_q && x->shape().size() != 2) {
    throw Error(command.x_path,
                "a packed batch (--cu-seqlens-q, --cu-seqlens-k) takes X as [total, d], the "
                "sequences' rows one after another, got " +
                    shape_string(x->shape()));
  }

  LayerWeights weights;
  if (fused) {
    const FusedSplit split = split_fused(*wqkv, command.wqkv_path, command.heads, kv_heads);
    weights.wq = split.q;
    weights.wk = split.k;
    weights.wv = split.v;
  } else {
    weights.wq = wq->view();
    weights.wk = wk->view();
    weights.wv = wv->view();
  }
  if (bqkv) {
    if (bqkv->shape().size() != 1) {
      throw Error(command.bqkv_path,
                  "expected a 1-D fused bias [3·H·dk], got " + shape_string(bqkv->shape()));
    }
    const FusedSplit split = split_fused(*bqkv, command.bqkv_path, command.heads, kv_heads);
    weights.bq = split.q;
    weights.bk = split.k;
    weights.bv = split.v;
  } else {
    weights.bq = view_of(bq);
    weights.bk = view_of(bk);
    weights.bv = view_of(bv);
  }
  weights.wo = view_of(wo);
  weights.bo = view_of(bo);

  LayerOptions options;
  options.heads = command.heads;
  options.kv_heads = command.kv_heads;
  options.attention = attention_options(command.flags, tensors);
  // float16 outputs are computed in float32 and rounded once as they are written, as attention()
  // does (the layer itself computes and returns float32 or float64).
  const DType out_dtype = options.attention.out_dtype;
  if (out_dtype == DType::kF16) options.attention.out_dtype = DType::kF32;
  apply_memory_budget(command.flags, input_bytes, options.attention);
  const LayerResult result = within_memory_budget("the layer", [&] {
    return multi_head_attention(x->view(), weights, options, view_of(memory));
  });

  std::vector<OutputFile> outputs = {{command.out_path, result.out.view()}};
  add_extra_outputs(command.flags, result.weights, result.lse, outputs);
  write_outputs(outputs, out_dtype);
}

}  // namespace

void register_layer_command(CLI::App& app) {
  auto command = std::make_shared<LayerCommand>();
  CLI::App* sub = app.add_subcommand(
      "layer", "multi-head attention from X and W^Q, W^K, W^V (+ W^O, biases, memory)");
  sub->add_option("--x", command->x_path,
                  "samples, one per row: [B,N,d] or [N,d] ([total,d] with --cu-seqlens-*)")
      ->required();
  sub->add_option("--wq", command->wq_path, "W^Q [d, H·dk] (X·W convention)");
  sub->add_option("--wk", command->wk_path, "W^K [d_m, Hkv·dk]");
  sub->add_option("--wv", command->wv_path, "W^V [d_m, Hkv·dv]");
  sub->add_option("--wqkv", command->wqkv_path,
                  "fused W^Q|W^K|W^V [d, (H + 2·Hkv)·dk] (GPT-2's c_attn), split into column "
                  "blocks; instead of --wq, --wk, --wv");
  sub->add_option("--heads", command->heads, "query heads H (contiguous column blocks)")
      ->required()
      ->check(CLI::PositiveNumber);
  sub->add_option("--kv-heads", command->kv_heads, "key/value heads Hkv (default H)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--wo", command->wo_path, "output projection W^O [H·dv, d_out]");
  sub->add_option("--bq", command->bq_path, "bias of Q [H·dk]");
  sub->add_option("--bk", command->bk_path, "bias of K [Hkv·dk]");
  sub->add_option("--bv", command->bv_path, "bias of V [Hkv·dv]");
  sub->add_option("--bqkv", command->bqkv_path, "fused bias of Q|K|V [(H + 2·Hkv)·dk]");
  sub->add_option("--bo", command->bo_path, "bias of the output [d_out] (needs --wo)");
  sub->add_flag("--linear-layout", command->linear_layout,
                "weight matrices are stored as nn.Linear weights [out, in] (BERT, PyTorch): "
                "transpose them on load");
  sub->add_option("--memory", command->memory_path,
                  "cross-attention: K and V from M [B,Nm,d_m] instead of X");
  sub->add_option("--out", command->out_path, "output [.., N, d_out] ([.., N, H·dv] without --wo)")
      ->required();
  add_attention_flags(
      *sub, command->flags,
      FlagGroups{.precision = true, .score_modifiers = true, .packed_batches = true});
  sub->footer(
      "Example:\n"
      "  qkv layer --x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 4 \\\n"
      "            --causal --out o.npy --weights w.npy\n"
      "  qkv layer --x h.npy --wqkv gpt2.safetensors:h.0.attn.c_attn.weight \\\n"
      "            --bqkv gpt2.safetensors:h.0.attn.c_attn.bias --heads 12 --causal --out o.npy\n"
      "Any tensor may be FILE.safetensors:NAME. A PyTorch nn.Linear weight is the transpose of\n"
      "W here: say --linear-layout. --weights is [B,H,Nq,Nk]. --dtype rounds the projected\n"
      "Q, K, V. Packed batches: X is [total, d] (M [total_m, d_m]); --cu-seqlens-q cuts X's\n"
      "rows, --cu-seqlens-k those of X (or M) that give K and V; --lse is [H, total].");
  sub->callback([command] { run_layer(*command); });
}

}  // namespace qkv::cli
