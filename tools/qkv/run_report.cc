#include "run_report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/mask_rule.h"
#include "core/parallel_for.h"
#include "kernels/kernel.h"

namespace qkv::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kFirstDrawSeconds = 1.0;  // runs shorter than a second stay silent
constexpr std::int64_t kRedrawNs = 100'000'000;

std::string format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

// "4.2 s", "3 min 05 s", "1 h 02 min": seconds to one decimal below a minute.
std::string duration(double seconds) {
  if (seconds < 59.95) return format("%.1f s", seconds);
  const auto whole = static_cast<std::int64_t>(std::llround(seconds));
  char buffer[48];
  if (whole < 3600) {
    std::snprintf(buffer, sizeof buffer, "%lld min %02lld s", static_cast<long long>(whole / 60),
                  static_cast<long long>(whole % 60));
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld h %02lld min",
                  static_cast<long long>(whole / 3600),
                  static_cast<long long>(whole % 3600 / 60));
  }
  return buffer;
}

// Writes straight to the descriptor: stdio's stderr buffer is not to be shared between the
// worker thread that draws and the main thread.
void write_stderr(const std::string& text) {
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

// QKV_PROGRESS_AFTER=S (seconds, >= 0) moves the first drawing: 0 shows the line at once (the
// tests use it); anything else that is not a number leaves the default.
std::int64_t first_draw_ns() {
  double seconds = kFirstDrawSeconds;
  if (const char* text = std::getenv("QKV_PROGRESS_AFTER"); text != nullptr) {
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end != text && *end == '\0' && value >= 0 && value < 1e6) seconds = value;
  }
  return static_cast<std::int64_t>(seconds * 1e9);
}

double peak_memory_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

std::int64_t element_as_int(const TensorView& t, std::int64_t i) {
  const std::int64_t at = i * (t.strides.empty() ? 1 : t.strides[0]);
  return t.dtype == DType::kI32 ? static_cast<const std::int32_t*>(t.data)[at]
                                : static_cast<const std::int64_t*>(t.data)[at];
}

// Allowed (query, key) pairs of one sequence under causal and the window.
double allowed_pairs(const core::Masking& masking, std::int64_t nq, std::int64_t nk) {
  if (!masking.has_structure()) return static_cast<double>(nq) * static_cast<double>(nk);
  double pairs = 0;
  for (std::int64_t i = 0; i < nq; ++i) {
    const core::KeyRange r = core::allowed_key_range(masking, nk, i + nk - nq);
    pairs += static_cast<double>(r.last - r.first);
  }
  return pairs;
}

}  // namespace

void add_report_flags(CLI::App& command, ReportFlags& flags) {
  // Registered by its long name only: CLI11 2.4 (Debian 13) refuses a short -v beside the
  // one-letter long option --v (the values file) as the same name, so main() reads -v as
  // --verbose before CLI11 sees it.
  command.add_flag("--verbose", flags.verbose,
                   "(or -v) after success, one line on stderr: shapes, kernel, SIMD target, "
                   "threads, time, GFLOP/s, peak memory");
  command.add_flag("--quiet", flags.quiet,
                   "no progress line (shown on a terminal for runs longer than about a second)");
}

ProgressLine::ProgressLine(bool enabled, std::string what, std::string unit)
    : enabled_(enabled && ::isatty(STDERR_FILENO) == 1),
      what_(std::move(what)),
      unit_(std::move(unit)),
      start_(Clock::now()),
      next_draw_ns_(first_draw_ns()) {}

ProgressLine::~ProgressLine() { erase(); }

AttentionOptions::ProgressFunction ProgressLine::callback() {
  if (!enabled_) return {};
  return [this](std::int64_t done, std::int64_t total) { report(done, total); };
}

void ProgressLine::report(std::int64_t done, std::int64_t total) {
  const std::int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
  if (now < next_draw_ns_.load(std::memory_order_relaxed)) return;
  // One drawer at a time; a report that finds the flag taken is simply not drawn.
  if (drawing_.exchange(true, std::memory_order_acquire)) return;
  if (now >= next_draw_ns_.load(std::memory_order_relaxed)) {
    next_draw_ns_.store(now + kRedrawNs, std::memory_order_relaxed);
    write_stderr("\r" + text(what_, done, total, static_cast<double>(now) * 1e-9, unit_) + "\x1b[K");
    drawn_.store(true, std::memory_order_relaxed);
  }
  drawing_.store(false, std::memory_order_release);
}

void ProgressLine::erase() {
  // The destructor erases too: a second call must not wait for a flag the first one kept.
  if (!enabled_ || erased_) return;
  erased_ = true;
  // Waits out a drawer still writing, then keeps the flag so that nothing draws again.
  while (drawing_.exchange(true, std::memory_order_acquire)) {
  }
  if (drawn_.exchange(false, std::memory_order_relaxed)) write_stderr("\r\x1b[K");
}

std::string ProgressLine::text(const std::string& what, std::int64_t done, std::int64_t total,
                               double elapsed_seconds, const std::string& unit) {
  const double fraction =
      total > 0 ? std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0)
                : 1.0;
  std::string line = what + ": " + format("%.0f%%", std::floor(fraction * 100.0)) + " of " +
                     std::to_string(total) + " " + unit + (total == 1 ? "" : "s") + ", " +
                     duration(elapsed_seconds);
  if (fraction > 0.0 && fraction < 1.0) {
    line += ", about " + duration(elapsed_seconds * (1.0 - fraction) / fraction) + " left";
  }
  return line;
}

std::string tensor_summary(const std::string& name, const Shape& shape, DType dtype) {
  return name + " " + shape_string(shape) + " " + dtype_name(dtype);
}

double attention_flops(const Shape& q, const Shape& k, const Shape& v,
                       const AttentionOptions& o) {
  if (q.size() < 2 || k.size() < 2 || v.size() < 2) return 0;
  core::Masking masking;
  masking.causal = o.causal;
  if (o.window) {
    masking.window_left = o.window->left;
    masking.window_right = o.window->right;
  }
  const double per_pair = 2.0 * static_cast<double>(q.back() + v.back());
  // Every leading dimension of Q (batch, heads) multiplies the pairs of one head.
  double heads = 1;
  for (std::size_t i = 0; i + 2 < q.size(); ++i) heads *= static_cast<double>(q[i]);
  if (o.cu_seqlens_q && o.cu_seqlens_k) {
    double pairs = 0;
    for (std::int64_t s = 0; s + 1 < o.cu_seqlens_q->numel(); ++s) {
      pairs += allowed_pairs(masking,
                             element_as_int(*o.cu_seqlens_q, s + 1) - element_as_int(*o.cu_seqlens_q, s),
                             element_as_int(*o.cu_seqlens_k, s + 1) - element_as_int(*o.cu_seqlens_k, s));
    }
    return heads * pairs * per_pair;
  }
  return heads * allowed_pairs(masking, q[q.size() - 2], k[k.size() - 2]) * per_pair;
}

std::string summary_line(const RunSummary& s) {
  std::string line = s.command + ": " + s.shapes + "; kernel " + s.kernel;
  if (s.kernel.ends_with("_hwy")) {
    line += " (" + kernels::simd_target_name();
    if (s.kernel == "fused_hwy" && s.compute) line += ", " + kernels::fused_hwy_path(*s.compute);
    line += ")";
  }
  const int threads = core::resolve_thread_count(s.threads);
  line += "; " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  line += "; " + format("%.3f s", s.seconds);
  if (s.flops > 0 && s.seconds > 0) line += "; " + format("%.1f GFLOP/s", s.flops / s.seconds * 1e-9);
  line += "; peak memory " + format("%.0f MiB", peak_memory_mib());
  return line;
}

}  // namespace qkv::cli
