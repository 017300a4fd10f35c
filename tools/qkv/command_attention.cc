// qkv attention: the core operation on given Q, K, V files.
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "qkv/attention.h"
#include "qkv/io.h"

namespace qkv::cli {
namespace {

struct AttentionCommand {
  std::string q_path, k_path, v_path, out_path;
  AttentionFlags flags;
};

void run_attention(const AttentionCommand& command) {
  const Tensor q = read_input(command.q_path);
  const Tensor k = read_input(command.k_path);
  const Tensor v = read_input(command.v_path);
  const std::optional<Tensor> mask = load_mask(command.flags);
  AttentionOptions options = attention_options(command.flags, mask);
  apply_memory_budget(command.flags,
                      q.nbytes() + k.nbytes() + v.nbytes() + (mask ? mask->nbytes() : 0), options);
  const AttentionResult result =
      within_memory_budget([&] { return attention(q.view(), k.view(), v.view(), options); });

  std::vector<OutputFile> outputs = {{command.out_path, result.out.view()}};
  add_extra_outputs(command.flags, result.weights, result.lse, outputs);
  write_outputs(outputs, options.out_dtype);
}

}  // namespace

void register_attention_command(CLI::App& app) {
  auto command = std::make_shared<AttentionCommand>();
  CLI::App* sub = app.add_subcommand(
      "attention",
      "softmax(scale·Q·K^T + mask)·V on given Q, K, V (.npy or FILE.safetensors:NAME)");
  sub->add_option("--q", command->q_path, "queries [B,H,Nq,D], [H,Nq,D] or [Nq,D]")->required();
  sub->add_option("--k", command->k_path, "keys [.., Hkv, Nk, D]; H % Hkv == 0")->required();
  sub->add_option("--v", command->v_path, "values [.., Hkv, Nk, Dv]")->required();
  sub->add_option("--out", command->out_path, "output [.., Nq, Dv]")->required();
  add_attention_flags(*sub, command->flags);
  sub->footer(
      "Example:\n"
      "  qkv attention --q q.npy --k k.npy --v v.npy --causal --out o.npy --weights w.npy\n"
      "Query head h uses kv head h / (H/Hkv). A row with no allowed key gives zeros and "
      "lse = -inf.\n"
      "Any tensor may be FILE.safetensors:NAME (F32, F64, F16, BF16 or BOOL).");
  sub->callback([command] { run_attention(*command); });
}

}  // namespace qkv::cli
