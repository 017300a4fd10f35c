// qkv layer: the seed's whole system, from X and the projection matrices.
#include <memory>
#include <optional>

#include "cli_common.h"
#include "commands.h"
#include "qkv/io.h"
#include "qkv/layer.h"

namespace qkv::cli {
namespace {

struct LayerCommand {
  std::string x_path, wq_path, wk_path, wv_path, wo_path;
  std::string bq_path, bk_path, bv_path, bo_path, memory_path;
  std::int64_t heads = 1;
  std::int64_t kv_heads = 0;
  std::string out_path;
  AttentionFlags flags;
};

std::optional<Tensor> read_optional(const std::string& path) {
  if (path.empty()) return std::nullopt;
  return read_npy(path);
}

std::optional<TensorView> view_of(const std::optional<Tensor>& tensor) {
  if (!tensor) return std::nullopt;
  return tensor->view();
}

void run_layer(const LayerCommand& command) {
  const Tensor x = read_npy(command.x_path);
  const Tensor wq = read_npy(command.wq_path);
  const Tensor wk = read_npy(command.wk_path);
  const Tensor wv = read_npy(command.wv_path);
  const std::optional<Tensor> wo = read_optional(command.wo_path);
  const std::optional<Tensor> bq = read_optional(command.bq_path);
  const std::optional<Tensor> bk = read_optional(command.bk_path);
  const std::optional<Tensor> bv = read_optional(command.bv_path);
  const std::optional<Tensor> bo = read_optional(command.bo_path);
  const std::optional<Tensor> memory = read_optional(command.memory_path);
  const std::optional<Tensor> mask = load_mask(command.flags);

  LayerWeights weights{wq.view(), wk.view(), wv.view(), view_of(wo),
                       view_of(bq), view_of(bk),  view_of(bv), view_of(bo)};
  LayerOptions options;
  options.heads = command.heads;
  options.kv_heads = command.kv_heads;
  options.attention = attention_options(command.flags, mask);
  const LayerResult result = multi_head_attention(x.view(), weights, options, view_of(memory));

  std::vector<OutputFile> outputs = {{command.out_path, result.out.view()}};
  add_extra_outputs(command.flags, result.weights, result.lse, outputs);
  write_outputs(outputs, options.attention.out_dtype);
}

}  // namespace

void register_layer_command(CLI::App& app) {
  auto command = std::make_shared<LayerCommand>();
  CLI::App* sub = app.add_subcommand(
      "layer", "multi-head attention from X and W^Q, W^K, W^V (+ W^O, biases, memory)");
  sub->add_option("--x", command->x_path, "samples, one per row: [B,N,d] or [N,d]")->required();
  sub->add_option("--wq", command->wq_path, "W^Q [d, H·dk] (X·W convention)")->required();
  sub->add_option("--wk", command->wk_path, "W^K [d_m, Hkv·dk]")->required();
  sub->add_option("--wv", command->wv_path, "W^V [d_m, Hkv·dv]")->required();
  sub->add_option("--heads", command->heads, "query heads H (contiguous column blocks)")
      ->required()
      ->check(CLI::PositiveNumber);
  sub->add_option("--kv-heads", command->kv_heads, "key/value heads Hkv (default H)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--wo", command->wo_path, "output projection W^O [H·dv, d_out]");
  sub->add_option("--bq", command->bq_path, "bias of Q [H·dk]");
  sub->add_option("--bk", command->bk_path, "bias of K [Hkv·dk]");
  sub->add_option("--bv", command->bv_path, "bias of V [Hkv·dv]");
  sub->add_option("--bo", command->bo_path, "bias of the output [d_out] (needs --wo)");
  sub->add_option("--memory", command->memory_path,
                  "cross-attention: K and V from M [B,Nm,d_m] instead of X");
  sub->add_option("--out", command->out_path, "output [.., N, d_out] ([.., N, H·dv] without --wo)")
      ->required();
  add_attention_flags(*sub, command->flags);
  sub->footer(
      "Example:\n"
      "  qkv layer --x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 4 \\\n"
      "            --causal --out o.npy --weights w.npy\n"
      "A PyTorch nn.Linear weight is the transpose of W here. --weights is [B,H,Nq,Nk].");
  sub->callback([command] { run_layer(*command); });
}

}  // namespace qkv::cli
