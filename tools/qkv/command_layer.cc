// qkv layer: the seed's whole system, from X and the projection matrices (layer_weights.h reads
// them, for qkv explain too).
#include <memory>
#include <optional>

#include "cli_common.h"
#include "commands.h"
#include "layer_weights.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/layer.h"

namespace qkv::cli {
namespace {

struct LayerCommand {
  std::string x_path, memory_path, out_path;
  WeightFlags weights;
  AttentionFlags flags;
};

void run_layer(const LayerCommand& command) {
  std::vector<std::string> specs = weight_specs(command.weights);
  specs.push_back(command.x_path);
  specs.push_back(command.memory_path);
  check_weight_flags(command.weights);
  const std::uint64_t input_bytes = check_input_sizes(command.flags, specs);
  const std::optional<Tensor> x = read_optional(command.x_path);
  LoadedWeights loaded;
  load_weights(command.weights, loaded);
  const std::optional<Tensor> memory = read_optional(command.memory_path);
  const AttentionTensors tensors = load_attention_tensors(command.flags);
  if (tensors.cu_seqlens_q && x->shape().size() != 2) {
    throw Error(command.x_path,
                "a packed batch (--cu-seqlens-q, --cu-seqlens-k) takes X as [total, d], the "
                "sequences' rows one after another, got " +
                    shape_string(x->shape()));
  }

  const LayerWeights& weights = loaded.weights;

  LayerOptions options;
  options.heads = command.weights.heads;
  options.kv_heads = command.weights.kv_heads;
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
  add_weight_flags(*sub, command->weights, /*heads_required=*/true);
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
      "Any tensor may be FILE.safetensors:NAME or FILE.npz:NAME (array NAME of np.savez or\n"
      "np.savez_compressed); outputs are .npy. A PyTorch nn.Linear weight is the transpose of\n"
      "W here: say --linear-layout. --weights is [B,H,Nq,Nk]. --dtype rounds the projected\n"
      "Q, K, V. Packed batches: X is [total, d] (M [total_m, d_m]); --cu-seqlens-q cuts X's\n"
      "rows, --cu-seqlens-k those of X (or M) that give K and V; --lse is [H, total].");
  sub->callback([command] { run_layer(*command); });
}

}  // namespace qkv::cli
