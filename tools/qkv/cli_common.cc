#include "cli_common.h"

#include <charconv>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::cli {
namespace {

std::int64_t parse_window_side(const std::string& text, const std::string& whole) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < -1) {
    throw Error("--window", "expected L,R with integers >= 0 or -1 (unbounded), got '" + whole +
                                "'");
  }
  return value;
}

}  // namespace

void add_attention_flags(CLI::App& command, AttentionFlags& flags) {
  command.add_option("--mask", flags.mask_path,
                     "bool (True = may attend) or float (added to the scaled scores; -inf "
                     "forbids) .npy, broadcastable to the scores [.., Nq, Nk]");
  command.add_flag("--causal", flags.causal,
                   "key j allowed iff j <= i + (Nk - Nq) (bottom-right aligned)");
  command.add_option("--window", flags.window,
                     "L,R: key j allowed iff i+(Nk-Nq)-L <= j <= i+(Nk-Nq)+R; -1 = unbounded");
  flags.scale_option =
      command.add_option("--scale", flags.scale, "multiplies q·k (default 1/sqrt(D); 1: textbook)");
  command.add_option("--weights", flags.weights_path, "also write the softmax weights [.., Nq, Nk]");
  command.add_option("--lse", flags.lse_path, "also write the log-sum-exp of the scores [.., Nq]");
  command.add_option("--out-dtype", flags.out_dtype, "dtype of every output")
      ->check(CLI::IsMember({"f32", "f64"}))
      ->default_str("f32");
  command.add_option("--threads", flags.threads, "threads to use (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  command.add_option("--kernel", flags.kernel,
                     "force a kernel (default: the fastest that supports the call)");
}

Window parse_window(const std::string& text) {
  const auto comma = text.find(',');
  if (comma == std::string::npos) {
    throw Error("--window", "expected L,R (two integers), got '" + text + "'");
  }
  return Window{parse_window_side(text.substr(0, comma), text),
                parse_window_side(text.substr(comma + 1), text)};
}

std::optional<Tensor> load_mask(const AttentionFlags& flags) {
  if (flags.mask_path.empty()) return std::nullopt;
  return read_npy(flags.mask_path);
}

AttentionOptions attention_options(const AttentionFlags& flags, const std::optional<Tensor>& mask) {
  AttentionOptions options;
  if (flags.scale_option != nullptr && flags.scale_option->count() > 0) options.scale = flags.scale;
  options.causal = flags.causal;
  if (!flags.window.empty()) options.window = parse_window(flags.window);
  if (mask) options.mask = mask->view();
  options.return_weights = !flags.weights_path.empty();
  options.return_lse = !flags.lse_path.empty();
  options.out_dtype = flags.out_dtype == "f64" ? DType::kF64 : DType::kF32;
  options.threads = flags.threads;
  options.kernel = flags.kernel;
  return options;
}

void add_extra_outputs(const AttentionFlags& flags, const Tensor& weights, const Tensor& lse,
                       std::vector<OutputFile>& outputs) {
  if (!flags.weights_path.empty()) outputs.push_back({flags.weights_path, weights.view()});
  if (!flags.lse_path.empty()) outputs.push_back({flags.lse_path, lse.view()});
}

void write_outputs(const std::vector<OutputFile>& outputs, DType dtype) {
  OutputFiles files;
  for (const OutputFile& output : outputs) files.stage_npy(output.path, output.tensor, dtype);
  files.commit();
}

}  // namespace qkv::cli
