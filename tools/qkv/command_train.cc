// qkv train: parses flags into train::TrainConfig, runs the training, reports the curve, writes
// the weights (--out) and the explain page (--html). The training itself is src/train/.
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "core/format_bytes.h"
#include "io/output_paths.h"
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
  std::string dtype = "f32";
  float lr = 3e-3f;
  std::string out_path, html_path;
  CLI::Option* out_option = nullptr;
  CLI::Option* html_option = nullptr;
  std::string max_memory;  // empty: the default budget
  bool json = false, quiet = false;
};

// --lr: a positive finite number that float32 holds (the optimizer's type), so that "nan",
// "inf" or 1e39 are refused by the parser, not found as NaN weights after the first step.
CLI::Validator learning_rate() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value) ||
            value <= 0 || value > std::numeric_limits<float>::max() ||
            static_cast<float>(value) == 0.0f) {
          return "must be a positive finite number within float32's range (3.4e38), got '" +
                 text + "'";
        }
        return {};
      },
      "> 0", "learning rate");
}

// --seed: a whole number from 0 to 2^64 - 1 in decimal digits. CLI11 reads "-1" into an
// unsigned integer as 2^64 - 1 and saturates longer numbers, so that -1, 2^64 and a 23-digit
// number were all one seed.
CLI::Validator seed_number() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        std::uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ptr != end || ec == std::errc::invalid_argument) {
          return "must be a whole number from 0 to 18446744073709551615, got '" + text + "'";
        }
        if (ec != std::errc()) {
          return "must be at most 18446744073709551615 (2^64 - 1), got '" + text + "'";
        }
        return {};
      },
      "0 to 2^64-1", "seed");
}

// The outputs, checked before any training: --out must name a .safetensors file (the weights
// by name, what qkv layer reads as FILE.safetensors:NAME), --html an explain page, neither
// empty; each must be a file that can be written (resolve_output: the folder exists and is
// writable, the name fits, not a directory or a device), and not the same file. A usage error
// (status 2) for the names, a file error (status 1) for the places, as other commands.
void check_outputs(const TrainCommand& command) {
  const auto has_suffix = [](const std::string& path, const std::string& suffix) {
    return path.size() > suffix.size() &&
           path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0 &&
           path[path.size() - suffix.size() - 1] != '/';
  };
  if (command.out_option->count() > 0 && !has_suffix(command.out_path, ".safetensors")) {
    throw CLI::ValidationError("--out",
                               "writes the weights as a .safetensors file; name one ending in "
                               ".safetensors, got '" +
                                   command.out_path + "'");
  }
  if (command.html_option->count() > 0 && command.html_path.empty()) {
    throw CLI::ValidationError("--html", "needs a file name, got ''");
  }
  std::vector<io::OutputTarget> targets;
  if (!command.out_path.empty()) {
    targets.push_back(io::resolve_output(command.out_path, command.out_path));
  }
  if (!command.html_path.empty()) {
    targets.push_back(io::resolve_output(command.html_path, command.html_path));
    if (targets.size() == 2 && io::same_output(targets[0], targets[1])) {
      throw CLI::ValidationError("--html", "names the same file as --out ('" +
                                               command.html_path + "')");
    }
  }
}

// The run's whole footprint against --max-memory, before anything is allocated: a
// configuration that needs more than the budget is one line at once, not an allocation that
// grows until the system refuses it.
void check_train_memory(const TrainCommand& command) {
  const std::uint64_t budget = memory_budget(command.max_memory);
  if (budget == 0) return;
  const train::TrainMemory memory = train::train_memory(command.config);
  if (memory.total() <= budget) return;
  throw Error("--max-memory",
              "qkv train needs " + core::format_bytes_exact(memory.total()) +
                  ": parameters, Adam state and gradients " +
                  core::format_bytes(memory.parameters) + ", a step's activations " +
                  core::format_bytes(memory.activations) + ", the largest layer call " +
                  core::format_bytes(memory.layer_call) + "; the memory budget is " +
                  core::format_bytes_exact(budget));
}

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
  c.attention_dtype = command.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  // A configuration no run can take is a usage error naming its flag, like a bad number.
  try {
    train::validate(c);
  } catch (const Error& e) {
    throw CLI::ValidationError(e.subject(), e.problem());
  }
  check_outputs(command);
  check_train_memory(command);
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
    j["dtype"] = command.dtype;
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
      ->check(learning_rate())
      ->capture_default_str();
  sub->add_option("--dropout", c.dropout,
                  "attention dropout P in [0, 1) while training (0: none); held-out evaluation "
                  "runs without it")
      ->check(dropout_rate_check());
  sub->add_option("--dtype", command->dtype,
                  "the attention's computation, forward and backward: f32, or bf16 (bf16 dot "
                  "products with float32 sums and softmax; the weights, their gradients and "
                  "Adam stay float32)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  sub->add_option("--seed", c.seed,
                  "seed of initialisation, training, dropout and held-out streams (0 to 2^64-1)")
      ->check(seed_number())
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
  command->out_option = sub->add_option(
      "--out", command->out_path,
      "write the weights as FILE.safetensors: embed.a, embed.b, layer{l}.wq/.wk/.wv/.wo "
      "([d,d], the X·W convention of qkv layer), readout.w [d,vocab], readout.b");
  command->html_option =
      sub->add_option("--html", command->html_path, "write the explain page of the trained layer");
  sub->add_option("--max-memory", command->max_memory,
                  "memory budget: refuse, before training, a run whose parameters, activations "
                  "and layer calls need more (e.g. 8G, 512MiB, 25%; 0: no limit; default 75% of "
                  "physical memory)");
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
