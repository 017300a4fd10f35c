#include "cli_common.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "core/mask_rule.h"
#include "core/memory_budget.h"
#include "core/validate.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::cli {
namespace {

std::int64_t parse_window_side(const std::string& text, const std::string& whole) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < -1) {
    throw Error("--window",
                "expected L,R with integers >= 0 or -1 (unbounded), got '" + whole + "'");
  }
  return value;
}

std::uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  std::uint64_t bytes = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size);
  // A container's limit (cgroup v2), when lower, is what the process can really use.
  std::ifstream limit("/sys/fs/cgroup/memory.max");
  std::uint64_t cgroup = 0;
  if (limit >> cgroup && cgroup > 0 && cgroup < bytes) bytes = cgroup;
  return bytes;
}

std::uint64_t parse_memory(const std::string& text) {
  const auto fail = [&]() -> std::uint64_t {
    throw Error("--max-memory",
                "expected a size such as 8G, 512MiB, 25% or 0 (no limit), got '" + text + "'");
  };
  if (text == "none" || text == "0") return 0;
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || !std::isfinite(value) || value < 0) return fail();
  std::string unit(ptr, end);
  if (unit == "%") {
    if (value > 100) return fail();
    return static_cast<std::uint64_t>(static_cast<double>(physical_memory()) * value / 100.0);
  }
  if (unit.ends_with("iB")) {
    unit.resize(unit.size() - 2);
  } else if (unit.size() > 1 && unit.back() == 'B') {
    unit.pop_back();
  }
  double scale = 1;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "K" || unit == "k") {
    scale = 1024.0;
  } else if (unit == "M") {
    scale = 1024.0 * 1024;
  } else if (unit == "G") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "T") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return fail();
  }
  const double bytes = value * scale;
  if (bytes >= 1.8e19) return fail();
  const auto result = static_cast<std::uint64_t>(bytes);
  return result == 0 ? fail() : result;
}

// A dtype word the parser has checked (--dtype, --out-dtype).
DType dtype_of_word(const std::string& word) {
  if (word == "f64") return DType::kF64;
  if (word == "bf16") return DType::kBF16;
  if (word == "f16") return DType::kF16;
  return DType::kF32;
}

[[noreturn]] void throw_inputs_too_large(std::uint64_t input_bytes, std::uint64_t budget) {
  throw Error("--max-memory", "the inputs alone take " + core::format_bytes_exact(input_bytes) +
                                  "; the memory budget is " + core::format_bytes_exact(budget));
}

// The readers name the tensor they could not allocate; any other allocation while reading (a
// large safetensors header, say) is reported against the file the same way.
template <typename Read>
auto reading(const std::string& spec, Read&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const std::bad_alloc&) {
    throw Error(spec, "out of memory reading it");
  }
}

}  // namespace

Tensor read_input(const std::string& spec) {
  return reading(spec, [&] { return read_tensor(spec); });
}

TensorInfo inspect_input(const std::string& spec) {
  return reading(spec, [&] { return inspect_tensor(spec); });
}

Tensor read_input_rows(const std::string& spec, std::span<const RowSpan> spans) {
  return reading(spec, [&] { return read_tensor_rows(spec, spans); });
}

std::uint64_t check_input_sizes(const AttentionFlags& flags,
                                const std::vector<std::string>& specs) {
  const std::uint64_t budget = memory_budget(flags);
  if (budget == 0) return 0;
  std::uint64_t bytes = 0;
  const auto count = [&](const std::string& spec, bool mask) {
    if (spec.empty()) return;
    const TensorInfo info = inspect_input(spec);
    // A 16-bit mask is held as float32 (load_mask): twice its stored size.
    const bool widened = mask && (info.dtype == DType::kF16 || info.dtype == DType::kBF16);
    bytes = core::saturating_add(bytes, widened ? core::saturating_mul(info.bytes, 2) : info.bytes);
  };
  for (const std::string& spec : specs) count(spec, false);
  count(flags.mask_path, true);
  count(flags.alibi_slopes_path, false);
  count(flags.sinks_path, false);
  for (const std::string* path : {&flags.cu_seqlens_q_path, &flags.cu_seqlens_k_path}) {
    if (path->empty()) continue;
    const TensorInfo info = reading(*path, [&] { return inspect_npy_offsets(*path); });
    bytes = core::saturating_add(bytes, info.bytes);
  }
  if (bytes >= budget) throw_inputs_too_large(bytes, budget);
  return bytes;
}

std::uint64_t memory_budget(const AttentionFlags& flags) { return memory_budget(flags.max_memory); }

std::uint64_t memory_budget(const std::string& max_memory) {
  if (!max_memory.empty()) return parse_memory(max_memory);
  return static_cast<std::uint64_t>(static_cast<double>(physical_memory()) *
                                    kDefaultMemoryFraction);
}

void apply_memory_budget(const AttentionFlags& flags, std::uint64_t input_bytes,
                         AttentionOptions& options) {
  const std::uint64_t budget = memory_budget(flags);
  options.max_memory = 0;
  if (budget == 0) return;
  if (input_bytes >= budget) throw_inputs_too_large(input_bytes, budget);
  options.max_memory = budget - input_bytes;
}

void add_attention_flags(CLI::App& command, AttentionFlags& flags, FlagGroups groups) {
  CLI::Option* mask = command.add_option(
      "--mask", flags.mask_path,
      "bool (True = may attend) or float (added to the scaled scores; -inf forbids) .npy, "
      "broadcastable to the scores [.., Nq, Nk]");
  command.add_flag("--causal", flags.causal,
                   "key j allowed iff j <= i + (Nk - Nq) (bottom-right aligned)");
  command.add_option("--window", flags.window,
                     "L,R: key j allowed iff i+(Nk-Nq)-L <= j <= i+(Nk-Nq)+R; -1 = unbounded");
  flags.scale_option =
      command.add_option("--scale", flags.scale, "multiplies q·k (default 1/sqrt(D); 1: textbook)");
  CLI::Option* weights = as_output(command.add_option(
      "--weights", flags.weights_path, "also write the softmax weights [.., Nq, Nk]"));
  as_output(command.add_option("--lse", flags.lse_path,
                               "also write the log-sum-exp of the scores [.., Nq]"));
  if (groups.precision) {
    command.add_option("--out-dtype", flags.out_dtype, "dtype of every output")
        ->check(CLI::IsMember({"f32", "f64", "f16"}))
        ->default_str("f32");
    command
        .add_option("--dtype", flags.dtype,
                    "storage type Q, K, V are rounded to (nearest even) for the computation "
                    "(default: f64, bf16 or f16 when all three are stored so, else f32; f64 "
                    "computes in float64, --dtype f32 opts float64 inputs into float32)")
        ->check(CLI::IsMember({"f64", "f32", "bf16", "f16"}));
  } else {
    command.add_option("--out-dtype", flags.out_dtype, "dtype of every output")
        ->check(CLI::IsMember({"f32", "f64"}))
        ->default_str("f32");
  }
  if (groups.score_modifiers) {
    flags.softcap_option =
        command.add_option("--softcap", flags.softcap, "C > 0: scores become C·tanh(score / C)")
            ->check(CLI::Validator(
                [](const std::string& text) -> std::string {
                  double value = 0;
                  const char* end = text.data() + text.size();
                  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
                  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value) ||
                      value <= 0) {
                    return "must be a finite number > 0, got '" + text + "'";
                  }
                  return {};
                },
                "", "softcap"));
    CLI::Option* alibi = command.add_flag(
        "--alibi", flags.alibi,
        "ALiBi with the standard slopes for H heads: adds -slope_h·|i + Nk - Nq - j| to the "
        "scores");
    command
        .add_option("--alibi-slopes", flags.alibi_slopes_path,
                    "ALiBi with given slopes: float .npy [H]")
        ->excludes(alibi);
    command.add_option("--sinks", flags.sinks_path,
                       "float .npy [H]: one extra logit per query head in the softmax's "
                       "denominator, with no value");
  }
  if (groups.packed_batches) {
    CLI::Option* cu_q = command.add_option(
        "--cu-seqlens-q", flags.cu_seqlens_q_path,
        "packed batch: query row offsets, int32/int64 .npy [B+1] (0 .. total_q); Q is "
        "[H,total_q,D] or [total_q,D]");
    CLI::Option* cu_k = command.add_option(
        "--cu-seqlens-k", flags.cu_seqlens_k_path,
        "key row offsets of the same B sequences (0 .. total_k); K, V are [Hkv,total_k,.]; "
        "sequence b: query rows CQ[b]..CQ[b+1] against key rows CK[b]..CK[b+1]");
    cu_q->needs(cu_k)->excludes(mask)->excludes(weights);
    cu_k->needs(cu_q)->excludes(mask)->excludes(weights);
  }
  if (groups.dropout) add_dropout_flags(command, flags.dropout, flags.seed, &flags.dropout_offset);
  add_threads_option(command, flags.threads,
                     "threads to use (default: all cores; a small call runs on fewer)");
  command.add_option("--kernel", flags.kernel,
                     "force a kernel: decode_hwy, fused_hwy, decode_scalar, unfused_blas, "
                     "fused_scalar or reference (default: the fastest that supports the call; "
                     "the decode kernels for up to 16 query rows per kv head)");
  command.add_option("--max-memory", flags.max_memory,
                     "memory budget: refuse, before allocating, a run that needs more (e.g. 8G, "
                     "512MiB, 25%; 0: no limit; default 75% of physical memory)");
}

namespace {

// A whole number in [0, limit]: digits only (no sign, point or exponent).
CLI::Validator whole_number_up_to(std::uint64_t limit, const std::string& range) {
  return CLI::Validator(
      [limit, range](std::string& text) -> std::string {
        std::uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0])) ||
            ec != std::errc() || ptr != end || value > limit) {
          return "must be an integer in " + range + ", got '" + text + "'";
        }
        return {};
      },
      range);
}

}  // namespace

CLI::Validator dropout_rate_check() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ec != std::errc() || ptr != end || !(value >= 0.0 && value < 1.0)) {
          return "must be a number in [0, 1), got '" + text + "'";
        }
        return {};
      },
      "[0, 1)", "dropout");
}

void add_dropout_flags(CLI::App& command, double& dropout, std::uint64_t& seed,
                       std::uint32_t* offset) {
  command
      .add_option("--dropout", dropout,
                  "P in [0, 1): drop each attention weight with probability P and scale the kept "
                  "ones by 1/(1-P) (training; P is rounded to a multiple of 2^-16); --weights "
                  "then holds the weights after dropout")
      ->check(dropout_rate_check());
  command
      .add_option("--seed", seed,
                  "dropout's seed (an integer, default 0): the same seed draws the same mask for "
                  "any thread count or kernel")
      ->check(whole_number_up_to(std::numeric_limits<std::uint64_t>::max(), "[0, 2^64)"));
  if (offset != nullptr) {
    command
        .add_option("--dropout-offset", *offset,
                    "dropout's counter offset (an integer in [0, 2^32), default 0): a second "
                    "stream for the same seed, as FlashAttention's Philox offset")
        ->check(whole_number_up_to(std::numeric_limits<std::uint32_t>::max(), "[0, 2^32)"));
  }
}

CLI::Validator at_least(std::int64_t minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        std::int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ec != std::errc() || ptr != end || value < minimum) {
          return "must be an integer >= " + std::to_string(minimum) + ", got '" + text + "'";
        }
        return "";
      },
      ">= " + std::to_string(minimum));
}

CLI::Option* add_threads_option(CLI::App& command, int& threads, const std::string& description) {
  const CLI::Validator count(
      [](std::string& text) -> std::string {
        long long value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ptr != end || ec == std::errc::invalid_argument) {
          return "must be a whole number, 0 (all cores) or more, got '" + text + "'";
        }
        // A whole number, perhaps beyond long long's range.
        if (text[0] == '-' && (ec != std::errc() || value < 0)) {
          return "must be 0 (all cores) or more, got " + text;
        }
        if (ec != std::errc() || value > std::numeric_limits<int>::max()) {
          return "must be at most " + std::to_string(std::numeric_limits<int>::max()) + ", got " +
                 text;
        }
        return {};
      },
      ">= 0");
  return command.add_option("--threads", threads, description)->check(count);
}

std::string closest_word(const std::string& word, const std::vector<std::string>& candidates) {
  // Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
  // neighbours ("casual" -> "causal" is one), each costing 1.
  const auto distance = [](const std::string& a, const std::string& b) {
    const std::size_t n = a.size();
    const std::size_t m = b.size();
    std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
    for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
    for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
    for (std::size_t i = 1; i <= n; ++i) {
      for (std::size_t j = 1; j <= m; ++j) {
        const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    return d[n][m];
  };
  const std::size_t limit = word.size() <= 4 ? 1 : std::max<std::size_t>(2, word.size() / 4);
  std::string best;
  std::size_t best_distance = limit + 1;
  const auto lower = [](std::string text) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  };
  for (const std::string& candidate : candidates) {
    // Case is the likeliest slip (--Q for --q): compared without it.
    const std::size_t at = distance(lower(word), lower(candidate));
    if (at < best_distance) {
      best = candidate;
      best_distance = at;
    }
  }
  return best;
}

namespace {

// The long options of the command that was parsed (or of qkv itself), as "--name".
std::vector<std::string> options_of_parsed_command(const CLI::App& app) {
  const CLI::App* command = &app;
  for (const CLI::App* sub : app.get_subcommands()) command = sub;
  std::vector<std::string> names;
  for (const CLI::Option* option : command->get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  }
  return names;
}

}  // namespace

std::string usage_problem(const CLI::App& app, const CLI::ParseError& error) {
  // What the parser could not place: options it does not know (--Q, -q) and stray words. Named
  // before anything else, so that a misspelt --q is not reported as "--q is required".
  for (const std::string& arg : app.remaining(/*recurse=*/true)) {
    if (arg.size() > 1 && arg[0] == '-' &&
        !(std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.')) {
      const std::size_t equals = arg.find('=');
      const std::string option = equals == std::string::npos ? arg : arg.substr(0, equals);
      const std::string near = closest_word(option, options_of_parsed_command(app));
      return "unknown option " + option + (near.empty() ? "" : "; did you mean " + near + "?");
    }
  }
  const std::vector<std::string> rest = app.remaining(/*recurse=*/true);
  if (!rest.empty()) return "unexpected argument '" + rest.front() + "'";
  return error.what();
}

std::string flag_for_subject(const std::string& subject) {
  static const std::pair<const char*, const char*> kFlags[] = {
      {"scale", "--scale"},
      {"window", "--window"},
      {"mask", "--mask"},
      {"return_weights", "--weights"},
      {"out_dtype", "--out-dtype"},
      {"threads", "--threads"},
      {"kernel", "--kernel"},
      {"max_memory", "--max-memory"},
      {"dtype", "--dtype"},
      {"softcap", "--softcap"},
      {"alibi", "--alibi"},
      {"alibi_slopes", "--alibi-slopes"},
      {"sinks", "--sinks"},
      {"cu_seqlens_q", "--cu-seqlens-q"},
      {"cu_seqlens_k", "--cu-seqlens-k"},
      {"dropout_p", "--dropout"},
      {"seed", "--seed"},
      {"dropout_offset", "--dropout-offset"},
      {"heads", "--heads"},
      {"kv-heads", "--kv-heads"},
  };
  for (const auto& [option, flag] : kFlags) {
    if (subject == option) return flag;
  }
  return subject;
}

Window parse_window(const std::string& text) {
  const auto comma = text.find(',');
  if (comma == std::string::npos) {
    throw Error("--window", "expected L,R (two integers), got '" + text + "'");
  }
  return Window{parse_window_side(text.substr(0, comma), text),
                parse_window_side(text.substr(comma + 1), text)};
}

std::optional<Tensor> read_optional(const std::string& spec) {
  if (spec.empty()) return std::nullopt;
  return read_input(spec);
}

std::optional<TensorView> view_of(const std::optional<Tensor>& tensor) {
  if (!tensor) return std::nullopt;
  return tensor->view();
}

// Masks are bool, float32 or float64 in the library; a float16 or bfloat16 mask file (as a
// safetensors F16 tensor is kept) is widened to float32 here, exactly.
std::optional<Tensor> load_mask(const AttentionFlags& flags) {
  if (flags.mask_path.empty()) return std::nullopt;
  return widen_mask(read_input(flags.mask_path), flags.mask_path);
}

Tensor widen_mask(Tensor mask, const std::string& spec) {
  if (mask.dtype() == DType::kF16 || mask.dtype() == DType::kBF16) {
    return reading(spec, [&] { return mask.to(DType::kF32); });
  }
  return mask;
}

AttentionTensors load_attention_tensors(const AttentionFlags& flags) {
  AttentionTensors tensors;
  tensors.mask = load_mask(flags);
  tensors.alibi_slopes = read_optional(flags.alibi_slopes_path);
  tensors.sinks = read_optional(flags.sinks_path);
  const auto offsets = [](const std::string& path) -> std::optional<Tensor> {
    if (path.empty()) return std::nullopt;
    return reading(path, [&] { return read_npy_offsets(path); });
  };
  tensors.cu_seqlens_q = offsets(flags.cu_seqlens_q_path);
  tensors.cu_seqlens_k = offsets(flags.cu_seqlens_k_path);
  return tensors;
}

AttentionOptions attention_options(const AttentionFlags& flags, const std::optional<Tensor>& mask) {
  AttentionOptions options;
  if (flags.scale_option != nullptr && flags.scale_option->count() > 0) {
    // Any finite scale is taken (beyond float32's range the float64 reference computes the
    // call); NaN, infinities and numbers past float64's range (1e400 reads as inf) are not.
    if (!std::isfinite(flags.scale)) {
      throw Error("--scale", "must be a finite number, got '" + flags.scale_option->as<std::string>() +
                                 "'");
    }
    options.scale = flags.scale;
  }
  options.causal = flags.causal;
  if (!flags.window.empty()) options.window = parse_window(flags.window);
  if (mask) options.mask = mask->view();
  options.return_weights = !flags.weights_path.empty();
  options.return_lse = !flags.lse_path.empty();
  options.out_dtype = dtype_of_word(flags.out_dtype);
  options.threads = flags.threads;
  options.kernel = flags.kernel;
  // The whole budget; commands that hold large inputs narrow it with apply_memory_budget.
  options.max_memory = memory_budget(flags);
  return options;
}

AttentionOptions attention_options(const AttentionFlags& flags, const AttentionTensors& tensors) {
  AttentionOptions options = attention_options(flags, tensors.mask);
  if (!flags.dtype.empty()) options.dtype = dtype_of_word(flags.dtype);
  // The parser's check took only finite numbers > 0.
  if (flags.softcap_option != nullptr && flags.softcap_option->count() > 0) {
    options.softcap = flags.softcap;
  }
  options.alibi = flags.alibi;
  options.alibi_slopes = view_of(tensors.alibi_slopes);
  options.sinks = view_of(tensors.sinks);
  options.cu_seqlens_q = view_of(tensors.cu_seqlens_q);
  options.cu_seqlens_k = view_of(tensors.cu_seqlens_k);
  options.dropout_p = flags.dropout;
  options.seed = flags.seed;
  options.dropout_offset = flags.dropout_offset;
  return options;
}

void add_extra_outputs(const AttentionFlags& flags, const Tensor& weights, const Tensor& lse,
                       std::vector<OutputFile>& outputs) {
  if (!flags.weights_path.empty()) {
    outputs.push_back({flags.weights_path, weights.view(), "--weights"});
  }
  if (!flags.lse_path.empty()) outputs.push_back({flags.lse_path, lse.view(), "--lse"});
}

CLI::Option* add_layout_option(CLI::App& command, std::string& layout, bool writes_tensors) {
  return command
      .add_option("--layout", layout,
                  std::string("order of Q, K, V's last 3 dims: bhnd = [.., H, N, D] (the "
                              "default), bnhd = [.., N, H, D] (tokens first)") +
                      (writes_tensors ? "; out and the gradients are written in it" : ""))
      ->check(CLI::IsMember({"bhnd", "bnhd"}));
}

HeadLayout resolve_layout(const std::string& layout, const Shape& q, const Shape& k,
                          const Shape& v, bool packed) {
  if (layout == "bnhd") return HeadLayout::kTokensFirst;
  if (layout == "bhnd" || packed || q.size() != 3 || k.size() != 3 || v.size() != 3) {
    return HeadLayout::kHeadsFirst;
  }
  const bool same_kv = k[0] == v[0] && k[1] == v[1] && q[2] == k[2];
  // An empty dimension reads the same either way (no rows or no heads: an empty answer).
  const bool empty = q[0] == 0 || q[1] == 0 || k[0] == 0 || k[1] == 0;
  const bool tokens_first_fits = same_kv && !empty && q[1] % k[1] == 0;
  // Tokens first fits (heads first too, or not): [N, H, D] files of grouped heads (Hkv < H)
  // read heads first became other heads, rows and grouping without a word. Heads first with
  // as many query rows as keys (self-attention, grouped or not) is what 3-D files have always
  // meant, and stays so; [N, H, D] files with Hkv = H cannot be told from it by their shapes.
  if (!tokens_first_fits || q[1] == k[1]) return HeadLayout::kHeadsFirst;
  const bool heads_first_fits = q[0] % k[0] == 0;  // k[0] > 0: not empty
  const auto n = [](std::int64_t value) { return std::to_string(value); };
  const std::string tokens_first = "[N, H, D] (Nq " + n(q[0]) + ", H " + n(q[1]) + ", Nk " +
                                   n(k[0]) + ", Hkv " + n(k[1]) + ")";
  const std::string say =
      "; say which with --layout bhnd (heads first) or --layout bnhd (tokens first)";
  if (!heads_first_fits) {
    throw Error("--q", shape_string(q) + " against K " + shape_string(k) +
                           " does not fit as [H, N, D] (H " + n(q[0]) + ", Hkv " + n(k[0]) +
                           ") but does as " + tokens_first + say);
  }
  throw Error("--q", shape_string(q) + " against K " + shape_string(k) +
                         " reads two ways: [H, N, D] (H " + n(q[0]) + ", Nq " + n(q[1]) +
                         ", Hkv " + n(k[0]) + ", Nk " + n(k[1]) + ") or " + tokens_first + say);
}

TensorView in_layout(const TensorView& view, HeadLayout layout) {
  if (layout == HeadLayout::kHeadsFirst || view.rank() < 3) return view;
  TensorView swapped = view;
  const std::size_t heads = view.shape.size() - 3;
  std::swap(swapped.shape[heads], swapped.shape[heads + 1]);
  std::swap(swapped.strides[heads], swapped.strides[heads + 1]);
  return swapped;
}

std::optional<OutputFormat> output_format(const std::string& path) {
  std::string extension = std::filesystem::path(path).extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (extension.empty() || extension == ".npy") return OutputFormat::kNpy;
  if (extension == ".npz") return OutputFormat::kNpz;
  if (extension == ".safetensors") return OutputFormat::kSafetensors;
  return std::nullopt;
}

CLI::Validator output_path() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        if (output_format(path)) return "";
        return "'" + path + "' has no output format; name it .npy, .npz or .safetensors";
      },
      "PATH.npy|.npz|.safetensors");
}

CLI::Option* as_output(CLI::Option* option) { return option->check(output_path()); }

namespace {

// --out-dtype f16: a finite value that rounds to infinity in float16 (65520 or more in
// magnitude: float16's largest is 65504) is refused rather than written as ±inf. Gradients and
// weights of float32 inputs may well be that large; -inf (the lse of a row with no allowed key)
// is written as it is.
void require_fits_float16(const OutputFile& output) {
  const TensorView& t = output.tensor;
  if (t.dtype != DType::kF32 && t.dtype != DType::kF64) return;
  const Tensor copy =
      t.strides == contiguous_strides(t.shape) ? Tensor() : contiguous_copy(t, t.dtype);
  const void* data = copy.empty() ? t.data : copy.data();
  const std::int64_t count = shape_numel(t.shape, t.name);
  for (std::int64_t i = 0; i < count; ++i) {
    const double value = core::load_real(data, t.dtype, i);
    if (std::isfinite(value) && std::fabs(value) >= 65520.0) {
      char text[32];
      std::snprintf(text, sizeof text, "%.6g", value);
      throw Error("--out-dtype",
                  "float16 cannot hold " + output.path + "'s value " + text + " at " +
                      core::index_string(t.shape, i) +
                      " (float16's largest is 65504; it would be written as infinity): use "
                      "--out-dtype f32");
    }
  }
}

}  // namespace

void write_outputs(const std::vector<OutputFile>& outputs, DType dtype) {
  if (dtype == DType::kF16) {
    for (const OutputFile& output : outputs) require_fits_float16(output);
  }
  OutputFiles files;
  // Outputs of one archive (.npz, .safetensors) are gathered under its path, in flag order.
  std::vector<std::pair<std::string, std::vector<const OutputFile*>>> archives;
  for (const OutputFile& output : outputs) {
    const std::optional<OutputFormat> format = output_format(output.path);
    if (!format) {
      throw Error(output.flag, "'" + output.path +
                                   "' has no output format; name it .npy, .npz or .safetensors");
    }
    if (*format == OutputFormat::kNpy) continue;
    auto found = std::find_if(archives.begin(), archives.end(),
                              [&](const auto& archive) { return archive.first == output.path; });
    if (found == archives.end()) {
      archives.push_back({output.path, {}});
      found = archives.end() - 1;
    }
    found->second.push_back(&output);
  }
  // Encoding allocates the file's bytes (and a converted copy when the dtype changes).
  const auto stage = [&](const std::string& path, auto&& encode) {
    try {
      encode();
    } catch (const core::OutOfMemory& e) {
      throw Error(path, "out of memory writing it: " + e.allocation());
    } catch (const std::bad_alloc&) {
      throw Error(path, "out of memory writing it");
    }
  };
  for (const OutputFile& output : outputs) {
    if (output_format(output.path) != OutputFormat::kNpy) continue;
    stage(output.path, [&] { files.stage_npy(output.path, output.tensor, dtype); });
  }
  for (const auto& [path, members] : archives) {
    stage(path, [&, &path = path, &members = members] {
      std::vector<std::pair<std::string, TensorView>> arrays;
      std::vector<Tensor> converted;
      converted.reserve(members.size());
      const bool npz = output_format(path) == OutputFormat::kNpz;
      for (const OutputFile* member : members) {
        const std::string name = member->flag.substr(member->flag.find_first_not_of('-'));
        if (npz || member->tensor.dtype == dtype) {
          arrays.emplace_back(name, member->tensor);
        } else {
          converted.push_back(contiguous_copy(member->tensor, dtype));
          arrays.emplace_back(name, converted.back().view());
        }
      }
      files.stage(path, npz ? encode_npz(arrays, dtype) : encode_safetensors(arrays));
    });
  }
  files.commit();
}

}  // namespace qkv::cli
