// qkv train: parses flags into train::TrainConfig, runs the training, reports the curve, writes
// the weights (--out) and the explain page (--html). The training itself is src/train/.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "train/trainer.h"

namespace qkv::cli {
namespace {

struct TrainCommand {
  train::TrainConfig config;
  std::string task = "recall";
  float lr = 3e-3f;
  std::string out_path, html_path;
  bool json = false, quiet = false;
};

void run_train(TrainCommand& command) {
  train::TrainConfig& c = command.config;
  c.task.task = command.task == "mqar" ? train::Task::kMqar : train::Task::kRecall;
  c.adam.lr = command.lr;
  train::validate(c);
  const bool line = !command.quiet && isatty(fileno(stderr)) != 0;
  const train::TrainResult result = train::train(c, [&](const train::CurvePoint& p) {
    if (line) {
      std::fprintf(stderr, "\r\033[Kqkv train: step %d/%d, loss %.4f, held-out accuracy %.1f%%, "
                   "%.1f steps/s", p.step, c.steps, p.loss, 100.0 * p.heldout_accuracy,
                   p.steps_per_second);
    }
  });
  if (line) std::fputs("\r\033[K", stderr);
  if (!command.out_path.empty()) {
    const auto tensors = train::model_tensors(result.model);
    std::vector<std::pair<std::string, TensorView>> views;
    for (const auto& [name, t] : tensors) views.emplace_back(name, t.view());
    OutputFiles out;
    out.stage(command.out_path, encode_safetensors(views));
    out.commit();
  }
  if (command.json) {
    nlohmann::ordered_json j;
    j["heldout_accuracy"] = result.heldout_accuracy;
    j["loss"] = result.loss;
    j["steps"] = c.steps;
    j["seconds"] = result.seconds;
    std::printf("%s\n", j.dump().c_str());
  } else if (!command.quiet) {
    std::fprintf(stderr, "qkv train: %s, %d steps in %.1f s: loss %.4f, held-out accuracy %.2f%%\n",
                 command.task.c_str(), c.steps, result.seconds, result.loss,
                 100.0 * result.heldout_accuracy);
  }
}

}  // namespace

void register_train_command(CLI::App& app) {
  auto command = std::make_shared<TrainCommand>();
  train::TrainConfig& c = command->config;
  CLI::App* sub = app.add_subcommand(
      "train", "teach a small attention model retrieval: a query matched against keys to fetch "
               "values");
  sub->add_option("--task", command->task, "recall (pair tokens E_key[k]+E_val[v], then query "
                  "keys) or mqar (k1 v1 k2 v2 ... then keys; Zoology's multi-query recall)")
      ->check(CLI::IsMember({"recall", "mqar"}))->capture_default_str();
  sub->add_option("--layers", c.layers, "attention layers (residual; mqar needs 2)")
      ->check(CLI::Range(1, 8))->capture_default_str();
  sub->add_option("--d-model", c.d_model, "model width")->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--heads", c.heads, "heads (must divide --d-model)")->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--pairs", c.task.pairs, "(key, value) pairs per sequence")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  sub->add_option("--queries", c.task.queries, "recall: query tokens per sequence")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  sub->add_option("--vocab", c.task.vocab, "number of keys (and of values)")
      ->check(CLI::Range(2, 65536))->capture_default_str();
  sub->add_option("--seq-len", c.task.seq_len, "mqar: sequence length (0: 2·pairs + queries)")
      ->check(CLI::Range(0, 65536))->capture_default_str();
  sub->add_option("--steps", c.steps, "Adam steps")->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  sub->add_option("--batch", c.batch, "sequences per step")->check(CLI::Range(1, 65536))
      ->capture_default_str();
  sub->add_option("--lr", command->lr, "Adam learning rate")->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--seed", c.seed, "seed of initialisation, training and held-out streams")
      ->capture_default_str();
  sub->add_option("--threads", c.threads, "threads (0: all); results do not depend on it")
      ->check(CLI::Range(0, 4096))->capture_default_str();
  sub->add_option("--eval-every", c.eval_every, "steps between held-out evaluations")
      ->check(CLI::Range(1, 10000000))->capture_default_str();
  sub->add_option("--heldout", c.heldout, "held-out sequences per evaluation")
      ->check(CLI::Range(1, 1000000))->capture_default_str();
  sub->add_option("--out", command->out_path,
                  "write the weights as .safetensors: embed.a, embed.b, layer{l}.wq/.wk/.wv/.wo "
                  "([d,d], the X·W convention of qkv layer), readout.w [d,vocab], readout.b");
  sub->add_option("--html", command->html_path, "write the explain page of the trained layer");
  sub->add_flag("--json", command->json, "end with one JSON object on stdout");
  sub->add_flag("--quiet", command->quiet, "no progress line or summary");
  sub->footer(
      "Example:\n"
      "  qkv train --out model.safetensors\n"
      "  qkv layer --x x.npy --wq model.safetensors:layer0.wq --wk model.safetensors:layer0.wk \\\n"
      "            --wv model.safetensors:layer0.wv --wo model.safetensors:layer0.wo --heads 1 \\\n"
      "            --causal --out y.npy");
  sub->callback([command] { run_train(*command); });
}

}  // namespace qkv::cli
