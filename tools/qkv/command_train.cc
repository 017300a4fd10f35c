// qkv train: parses flags into train::TrainConfig, runs the training, reports the curve, writes
// the weights (--out) and the explain page (--html). The training itself is src/train/.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_common.h"
#include "commands.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/io.h"
#include "qkv/layer.h"
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

// The explain page of the trained model's first layer on the first held-out sequence: each
// query's row of weights should sit on the key it asks about.
std::string explain_page(const train::TrainResult& result, const train::TrainConfig& c) {
  const train::Sequence s = train::heldout_sequence(c, 0);
  const std::int64_t n = s.length(), d = result.model.d;
  const std::vector<float> input = train::layer_input(result.model, c, s, 0);
  Tensor x(DType::kF32, {n, d}, "x");
  std::copy(input.begin(), input.end(), x.data_as<float>());
  const auto matrix = [&](const std::vector<float>& w, const char* name) {
    Tensor t(DType::kF32, {d, d}, name);
    std::copy(w.begin(), w.end(), t.data_as<float>());
    return t;
  };
  const Tensor wq = matrix(result.model.wq[0], "layer0.wq"),
               wk = matrix(result.model.wk[0], "layer0.wk"),
               wv = matrix(result.model.wv[0], "layer0.wv");
  LayerOptions options;
  options.heads = c.heads;
  options.attention.causal = true;
  options.attention.threads = c.threads;
  ExplainSetup setup;
  for (std::int64_t t = 0; t < n; ++t) {
    const std::string label = train::token_label(s, c.task.task, c.task.vocab, static_cast<int>(t));
    setup.query_labels.push_back(label);
    setup.key_labels.push_back(label);
  }
  setup.title = "qkv train: what the trained layer attends to on a held-out sequence";
  setup.story =
      "This layer was trained by qkv train on sequences it never saw like this one. Each query "
      "token ?k asks for the value paired with key k. Attention is retrieval, as the classic "
      "explanation has it: the query is matched against the keys to fetch their values. Open a "
      "query row (labelled ?k): its weight sits on the token that holds key k, and the value it "
      "fetches is the answer.";
  const Explanation e = explain_layer(x.view(), LayerWeights{wq.view(), wk.view(), wv.view()},
                                      options, std::nullopt, setup);
  std::vector<HeadScan> scans;
  for (std::int64_t h = 0; h < e.heads; ++h) scans.push_back(scan_head(e, h));
  PageView open;
  open.row = n - 1;  // the last query
  return html_page({e}, {scans}, open);
}

void run_train(TrainCommand& command) {
  train::TrainConfig& c = command.config;
  c.task.task = command.task == "mqar" ? train::Task::kMqar : train::Task::kRecall;
  c.adam.lr = command.lr;
  train::validate(c);
  const bool line = !command.quiet && isatty(fileno(stderr)) != 0;
  const train::TrainResult result = train::train(c, [&](const train::CurvePoint& p) {
    if (line) {
      std::fprintf(stderr,
                   "\r\033[Kqkv train: step %d/%d, loss %.4f, held-out accuracy %.1f%%, "
                   "%.1f steps/s",
                   p.step, c.steps, p.loss, 100.0 * p.heldout_accuracy, p.steps_per_second);
    }
  });
  if (line) std::fputs("\r\033[K", stderr);
  // Both files, or neither (OutputFiles: staged, then renamed together).
  OutputFiles out;
  if (!command.out_path.empty()) {
    const auto tensors = train::model_tensors(result.model);
    std::vector<std::pair<std::string, TensorView>> views;
    for (const auto& [name, t] : tensors) views.emplace_back(name, t.view());
    out.stage(command.out_path, encode_safetensors(views));
  }
  if (!command.html_path.empty()) {
    const std::string page = explain_page(result, c);
    out.stage(command.html_path, std::vector<char>(page.begin(), page.end()));
  }
  out.commit();
  if (command.json) {
    nlohmann::ordered_json j;
    j["heldout_accuracy"] = result.heldout_accuracy;
    j["loss"] = result.loss;
    j["steps"] = c.steps;
    j["seconds"] = result.seconds;
    nlohmann::ordered_json curve = nlohmann::ordered_json::array();
    for (const train::CurvePoint& p : result.curve) {
      curve.push_back(
          {{"step", p.step}, {"loss", p.loss}, {"heldout_accuracy", p.heldout_accuracy}});
    }
    j["curve"] = curve;
    std::printf("%s\n", j.dump().c_str());
  } else if (!command.quiet) {
    std::fprintf(stderr, "qkv train: %s, %d steps in %.1f s: loss %.4f, held-out accuracy %.2f%%\n",
                 command.task.c_str(), c.steps, result.seconds, result.loss,
                 100.0 * result.heldout_accuracy);
    std::string curve = "curve (step: held-out accuracy):";
    for (const train::CurvePoint& p : result.curve) {
      char point[48];
      std::snprintf(point, sizeof point, " %d: %.1f%%", p.step, 100.0 * p.heldout_accuracy);
      curve += point;
    }
    std::fprintf(stderr, "%s\n", curve.c_str());
  }
}

}  // namespace

void register_train_command(CLI::App& app) {
  auto command = std::make_shared<TrainCommand>();
  train::TrainConfig& c = command->config;
  CLI::App* sub = app.add_subcommand(
      "train",
      "teach a small attention model retrieval: a query matched against keys to fetch "
      "values");
  sub->add_option("--task", command->task,
                  "recall (pair tokens E_key[k]+E_val[v], then query "
                  "keys) or mqar (k1 v1 k2 v2 ... then keys; Zoology's multi-query recall)")
      ->check(CLI::IsMember({"recall", "mqar"}))
      ->capture_default_str();
  sub->add_option("--layers", c.layers, "attention layers (residual; mqar needs 2)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  sub->add_option("--d-model", c.d_model, "model width")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--heads", c.heads, "heads (must divide --d-model)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--pairs", c.task.pairs, "(key, value) pairs per sequence")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--queries", c.task.queries, "recall: query tokens per sequence")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--vocab", c.task.vocab, "number of keys (and of values)")
      ->check(CLI::Range(2, 65536))
      ->capture_default_str();
  sub->add_option("--seq-len", c.task.seq_len, "mqar: sequence length (0: 2·pairs + queries)")
      ->check(CLI::Range(0, 65536))
      ->capture_default_str();
  sub->add_option("--steps", c.steps, "Adam steps")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  sub->add_option("--batch", c.batch, "sequences per step")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  sub->add_option("--lr", command->lr, "Adam learning rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--dropout", c.dropout,
                  "attention dropout P in [0, 1) while training (0: none); held-out evaluation "
                  "runs without it")
      ->check(dropout_rate_check());
  sub->add_option("--seed", c.seed, "seed of initialisation, training, dropout and held-out streams")
      ->capture_default_str();
  sub->add_option("--threads", c.threads, "threads (0: all); results do not depend on it")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub->add_option("--eval-every", c.eval_every, "steps between held-out evaluations")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  sub->add_option("--heldout", c.heldout, "held-out sequences per evaluation")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
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
