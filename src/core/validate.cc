#include "core/validate.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/broadcast.h"
#include "core/mask_rule.h"
#include "core/parallel_for.h"
#include "core/score_modifiers.h"
#include "qkv/error.h"

namespace qkv::core {
namespace {

std::string str(std::int64_t n) { return std::to_string(n); }

// Calls visit(value, flat_index) for each element of a real view (float32, float64, bfloat16 or
// float16: every value, NaN and infinity included, widens to double exactly), in C order.
template <typename Visit>
void for_each_real(const TensorView& view, Visit visit) {
  const std::size_t rank = view.shape.size();
  const std::int64_t count = view.numel();
  if (view.is_contiguous()) {  // the common case, without per-element index bookkeeping
    for (std::int64_t flat = 0; flat < count; ++flat) {
      visit(load_real(view.data, view.dtype, flat), flat);
    }
    return;
  }
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t offset = 0;
  for (std::int64_t flat = 0; flat < count; ++flat) {
    visit(load_real(view.data, view.dtype, offset), flat);
    for (std::size_t axis = rank; axis-- > 0;) {
      offset += view.strides[axis];
      if (++index[axis] < view.shape[axis]) break;
      offset -= view.strides[axis] * view.shape[axis];
      index[axis] = 0;
    }
  }
}

}  // namespace

std::string index_string(const Shape& shape, std::int64_t flat) {
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::size_t axis = shape.size(); axis-- > 0;) {
    if (shape[axis] <= 0) continue;
    index[axis] = flat % shape[axis];
    flat /= shape[axis];
  }
  std::string text = "[";
  for (std::size_t axis = 0; axis < index.size(); ++axis) {
    text += (axis == 0 ? "" : ", ") + str(index[axis]);
  }
  return text + "]";
}

void require_fits_float16(const Tensor& computed) {
  if (computed.dtype() != DType::kF32 && computed.dtype() != DType::kF64) return;
  for (std::int64_t i = 0; i < computed.numel(); ++i) {
    const double value = computed.dtype() == DType::kF32
                             ? static_cast<double>(computed.data_as<float>()[i])
                             : computed.data_as<double>()[i];
    if (std::isfinite(value) && std::fabs(value) >= 65520.0) {
      char text[32];
      std::snprintf(text, sizeof text, "%.6g", value);
      throw Error("out_dtype", "float16 cannot hold the " + computed.name() + "'s value " + text +
                                   " at " + index_string(computed.shape(), i) +
                                   " (its largest is 65504; rounding would make it infinite)");
    }
  }
}

void require_view_consistent(const TensorView& view) {
  if (view.strides.size() != view.shape.size()) {
    throw Error(view.name, "has " + str(view.rank()) + " dims but " +
                               str(static_cast<std::int64_t>(view.strides.size())) + " strides");
  }
  if (view.data == nullptr && view.numel() > 0) throw Error(view.name, "has no data");
}

namespace {

// Masks are float32 or float64 (or bool, checked before).
void require_real(const TensorView& view) {
  if (view.dtype != DType::kF32 && view.dtype != DType::kF64) {
    throw Error(view.name, std::string("dtype ") + dtype_name(view.dtype) +
                               " is not supported (expected float32 or float64)");
  }
}

// Q, K and V may also be stored in 16 bits: the kernels widen them to float32 as they read.
void require_input_dtype(const TensorView& view) {
  if (view.dtype != DType::kF32 && view.dtype != DType::kF64 && view.dtype != DType::kBF16 &&
      view.dtype != DType::kF16) {
    throw Error(view.name, std::string("dtype ") + dtype_name(view.dtype) +
                               " is not supported (expected float32, float64, bfloat16 or "
                               "float16)");
  }
}

// A mask is bool or float; a float mask may hold -inf (forbidden) but not NaN or +inf. Returns
// the largest magnitude of a float mask's finite values (0 for a bool mask).
double validate_mask(const TensorView& mask) {
  require_view_consistent(mask);
  if (mask.dtype == DType::kBool) return 0.0;
  require_real(mask);
  double max_abs = 0.0;
  for_each_real(mask, [&](double value, std::int64_t flat) {
    if (std::isnan(value) || value == std::numeric_limits<double>::infinity()) {
      throw Error(mask.name, std::string("float mask holds ") +
                                 (std::isnan(value) ? "NaN" : "+inf") + " at " +
                                 index_string(mask.shape, flat) +
                                 " (only finite values and -inf are allowed)");
    }
    if (std::isfinite(value)) max_abs = std::max(max_abs, std::abs(value));
  });
  return max_abs;
}

}  // namespace

Strides4 canonical_strides(const Shape& strides) {
  const std::size_t rank = strides.size();
  Strides4 s;
  s.col = strides[rank - 1];
  s.row = strides[rank - 2];
  if (rank >= 3) s.h = strides[rank - 3];
  if (rank >= 4) s.b = strides[rank - 4];
  return s;
}

namespace {

// The number of innermost rows of a view (every index but the last): 1 for a scalar.
std::int64_t innermost_rows(const TensorView& view) {
  if (view.rank() == 0) return 1;
  const std::int64_t width = view.shape.back();
  return width == 0 ? 0 : view.numel() / width;
}

// Calls row(offset) with the element offset of the start of each innermost row in [r0, r1), in
// C order.
template <class Row>
void for_each_row_offset(const TensorView& view, std::int64_t r0, std::int64_t r1, Row row) {
  const std::size_t rank = view.shape.size();
  if (rank == 0) {
    if (r0 == 0 && r1 > 0) row(std::int64_t{0});
    return;
  }
  std::vector<std::int64_t> index(rank - 1, 0);
  std::int64_t offset = 0;
  std::int64_t rest = r0;
  for (std::size_t axis = rank - 1; axis-- > 0;) {
    index[axis] = rest % view.shape[axis];
    rest /= view.shape[axis];
    offset += index[axis] * view.strides[axis];
  }
  for (std::int64_t r = r0; r < r1; ++r) {
    row(offset);
    for (std::size_t axis = rank - 1; axis-- > 0;) {
      offset += view.strides[axis];
      if (++index[axis] < view.shape[axis]) break;
      offset -= view.strides[axis] * view.shape[axis];
      index[axis] = 0;
    }
  }
}

// Magnitudes below this need no exact maximum: the float32 kernels' range checks pass for any
// realistic D, Nk and scale when every input is below 2^32 (validate.h), so the hot scan only
// asks whether some element reaches it. A NaN or an infinity reaches it too (with the sign bit
// cleared, IEEE values order as their bits do, as signed integers, which SSE2 compares), so one
// compare-and-or per element answers both questions, as cheaply as the finiteness test alone;
// only a view that reaches it is walked again, exactly.
constexpr double kLargeMagnitude = 4294967296.0;  // 2^32
constexpr std::int32_t kLargeBits32 = 0x4f800000;
constexpr std::int64_t kLargeBits64 = 0x41f0000000000000;
// bfloat16 reaches float32's range, so it is asked the same question (2^32 is 0x4f80 in its
// bits). float16's finite values are below 65520: only its exponent mask (a NaN or an infinity)
// needs finding, and a float16 view that passes is bounded by its largest finite value.
constexpr std::int16_t kLargeBitsBF16 = 0x4f80;
constexpr std::int16_t kNonFiniteBitsF16 = 0x7c00;
constexpr double kF16Max = 65504.0;

template <class Float, class Bits>
bool any_large(const Float* x, std::int64_t count, Bits large) noexcept {
  constexpr Bits kMagnitude = std::numeric_limits<Bits>::max();
  Bits found = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    found |= static_cast<Bits>((std::bit_cast<Bits>(x[i]) & kMagnitude) >= large);
  }
  return found != 0;
}

// `view` with its dimensions in memory order (strides decreasing), those that run on from one
// another merged, and those of extent 1 or stride 0 (a broadcast repeats elements) left out:
// the same elements, each once, so a scan that only asks whether some element is large or not
// finite may read them in this order. A transposed contiguous tensor (torch's q.transpose(1, 2)
// of [B, N, H, D], as transformers makes its heads) becomes one run, read front to back; read
// in C order it was rows of D a head's stride apart, revisiting each stretch of memory H times:
// about 6 ms of a 20-ms call at B = 32, N = 128, H = 12, D = 32 (perf), where the same tensor
// made contiguous scans in under 1 ms.
constexpr std::int64_t kScanRow = 8192;

TensorView memory_order(const TensorView& view) {
  if (view.numel() == 0) return view;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, extent)
  for (std::size_t axis = 0; axis < view.shape.size(); ++axis) {
    if (view.shape[axis] != 1 && view.strides[axis] != 0) {
      dims.emplace_back(view.strides[axis], view.shape[axis]);
    }
  }
  std::stable_sort(dims.begin(), dims.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  TensorView ordered{view.data, view.dtype, {}, {}, view.name};
  for (const auto& [stride, extent] : dims) {
    if (!ordered.shape.empty() && ordered.strides.back() == stride * extent) {
      ordered.shape.back() *= extent;
      ordered.strides.back() = stride;
    } else {
      ordered.shape.push_back(extent);
      ordered.strides.push_back(stride);
    }
  }
  if (ordered.shape.empty()) {  // a single element
    ordered.shape = {1};
    ordered.strides = {1};
  }
  // Rows are what the scan's threads share: a long unit-stride run is cut into rows of at most
  // kScanRow elements where its length allows (halving while even).
  std::int64_t width = ordered.shape.back();
  if (ordered.strides.back() == 1 && width > kScanRow) {
    while (width > kScanRow && width % 2 == 0) width /= 2;
    ordered.shape.back() /= width;
    ordered.strides.back() = width;
    ordered.shape.push_back(width);
    ordered.strides.push_back(1);
  }
  return ordered;
}

// The fast scan: real views whose last dim has unit stride (contiguous tensors and column
// blocks of a wider matrix alike), row by row.
bool has_fast_scan(const TensorView& view) {
  const bool real = view.dtype == DType::kF32 || view.dtype == DType::kF64 ||
                    view.dtype == DType::kBF16 || view.dtype == DType::kF16;
  return real && (view.rank() == 0 || view.strides.back() == 1);
}

// The bound on a fast-scan view that the scan did not flag.
double unflagged_bound(const TensorView& view) {
  return view.dtype == DType::kF16 ? kF16Max : kLargeMagnitude;
}

// Whether rows [r0, r1) of a fast-scan view hold a NaN, an infinity or (but for float16) a
// magnitude of at least kLargeMagnitude.
bool any_large_rows(const TensorView& view, std::int64_t r0, std::int64_t r1) {
  bool large = false;
  const std::int64_t width = view.rank() == 0 ? 1 : view.shape.back();
  for_each_row_offset(view, r0, r1, [&](std::int64_t offset) {
    switch (view.dtype) {
      case DType::kF32:
        large |= any_large(static_cast<const float*>(view.data) + offset, width, kLargeBits32);
        break;
      case DType::kF64:
        large |= any_large(static_cast<const double*>(view.data) + offset, width, kLargeBits64);
        break;
      case DType::kBF16:
        large |=
            any_large(static_cast<const std::uint16_t*>(view.data) + offset, width, kLargeBitsBF16);
        break;
      case DType::kF16:
        large |= any_large(static_cast<const std::uint16_t*>(view.data) + offset, width,
                           kNonFiniteBitsF16);
        break;
      case DType::kBool:
      case DType::kI32:
      case DType::kI64:
        break;
    }
  });
  return large;
}

// The element-wise walk: slow, but names the first bad element. Returns the largest magnitude.
double throw_if_non_finite(const TensorView& view) {
  double max_abs = 0.0;
  for_each_real(view, [&](double value, std::int64_t flat) {
    if (!std::isfinite(value)) {
      throw Error(view.name, std::string("holds ") + (std::isnan(value) ? "NaN" : "an infinity") +
                                 " at " + index_string(view.shape, flat) +
                                 " (inputs must be finite)");
    }
    max_abs = std::max(max_abs, std::abs(value));
  });
  return max_abs;
}

// Rounding to a 16-bit storage type must not make a finite input infinite: values at or
// beyond the rounding threshold of its largest finite value (float16: 65520, bfloat16:
// 2^128 - 2^119) are refused, naming the tensor. `bounds` are the scan's magnitudes, exact or an
// upper bound (2^32 for a view with nothing larger); a bound beyond the threshold is made exact
// first (one more pass, only for such calls), and kept.
void require_within_storage_type(DType compute, std::initializer_list<const TensorView*> views,
                                 std::initializer_list<double*> bounds) {
  if (compute != DType::kF16 && compute != DType::kBF16) return;
  const double threshold = compute == DType::kF16 ? 65520.0 : 0x1.ffp127;
  auto bound = bounds.begin();
  for (const TensorView* view : views) {
    double& magnitude = **bound++;
    if (view->dtype == compute || magnitude < threshold) continue;
    magnitude = throw_if_non_finite(*view);
    if (magnitude >= threshold) {
      char value[32];
      std::snprintf(value, sizeof value, "%.6g", magnitude);
      throw Error(view->name, std::string("holds a value of magnitude ") + value +
                                  ", which rounds to infinity in " + dtype_name(compute) +
                                  " (dtype; its largest finite value is " +
                                  (compute == DType::kF16 ? "65504" : "3.39e38") + ")");
    }
  }
}

// Elements per extra thread below which a second thread costs more to start (~35 us) than it
// saves on the scan (1 MiB of float32 from L3 takes about that long).
constexpr std::int64_t kScanElementsPerThread = std::int64_t{1} << 18;

}  // namespace

std::vector<double> require_finite(std::initializer_list<const TensorView*> views, int threads) {
  // The rows of every fast-scan view, end to end, split between the threads; each thread
  // flags the views it saw a bad value in, and the first flagged view (in the order given) is
  // walked element by element for the message, so the error is the same for any thread count.
  // Each view is scanned in memory order (memory_order); the walk for the message keeps C order.
  std::vector<TensorView> fast;
  std::vector<char> scanned;  // scanned[i]: views[i] has the fast scan
  std::vector<std::int64_t> first_row{0};
  std::int64_t elements = 0;
  for (const TensorView* view : views) {
    TensorView ordered = memory_order(*view);
    scanned.push_back(has_fast_scan(ordered));
    if (!scanned.back()) continue;
    first_row.push_back(first_row.back() + innermost_rows(ordered));
    elements += ordered.numel();
    fast.push_back(std::move(ordered));
  }
  const std::int64_t rows = first_row.back();
  const int workers = static_cast<int>(
      std::clamp<std::int64_t>(elements / kScanElementsPerThread, 1, std::max(1, threads)));
  // flagged[w * fast.size() + f]: worker w saw a non-finite or large value in fast[f].
  std::vector<char> flagged(static_cast<std::size_t>(workers) * fast.size(), 0);
  parallel_for(workers, workers, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t w = begin; w < end; ++w) {
      const std::int64_t r0 = rows * w / workers;
      const std::int64_t r1 = rows * (w + 1) / workers;
      for (std::size_t f = 0; f < fast.size(); ++f) {
        const std::int64_t lo = std::max(r0, first_row[f]) - first_row[f];
        const std::int64_t hi = std::min(r1, first_row[f + 1]) - first_row[f];
        const std::size_t slot = static_cast<std::size_t>(w) * fast.size() + f;
        if (lo < hi && any_large_rows(fast[f], lo, hi)) flagged[slot] = 1;
      }
    }
  });
  // A view that the fast scan did not flag is bounded by kLargeMagnitude (float16 by its
  // largest finite value); any other is walked element by element, which names a bad element
  // or gives its exact largest magnitude.
  std::vector<double> max_abs;
  std::size_t f = 0;  // fast[f] is the next fast-scan view in the order given
  std::size_t i = 0;
  for (const TensorView* view : views) {
    bool walk = true;  // a view without the fast scan is always walked
    if (scanned[i++] != 0) {
      walk = false;
      for (int w = 0; w < workers; ++w) {
        walk |= flagged[static_cast<std::size_t>(w) * fast.size() + f] != 0;
      }
      ++f;
    }
    max_abs.push_back(walk ? throw_if_non_finite(*view) : unflagged_bound(*view));
  }
  return max_abs;
}

void require_finite(const TensorView& view) { require_finite({&view}, 1); }

void apply_call_options(const AttentionOptions& options, std::int64_t d, AttentionParams& p) {
  // With D = 0 every q·k is an empty sum, 0 whatever the scale: the default is then 1 rather
  // than 1/sqrt(0), and the weights are uniform over the allowed keys.
  const double default_scale = d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0;
  const double scale = options.scale.value_or(default_scale);
  if (!std::isfinite(scale)) throw Error("scale", "must be a finite number");
  p.scale = scale;

  p.masking.causal = options.causal;
  if (options.window) {
    if (options.window->left < -1 || options.window->right < -1) {
      throw Error("window", "L and R must be >= 0, or -1 for unbounded");
    }
    p.masking.window_left = options.window->left;
    p.masking.window_right = options.window->right;
  }
  if (options.threads < 0) throw Error("threads", "must be >= 0 (0: one per hardware thread)");
  p.threads = resolve_thread_count(options.threads);
}

AttentionCall validate_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionOptions& options, bool defer_kv_scan) {
  for (const TensorView* t : {&q, &k, &v}) {
    require_view_consistent(*t);
    require_input_dtype(*t);
  }
  if (q.rank() < 2 || q.rank() > 4) {
    throw Error(q.name, "expected 2, 3 or 4 dims ([Nq,D], [H,Nq,D] or [B,H,Nq,D]), got " +
                            str(q.rank()) + " " + shape_string(q.shape));
  }
  for (const TensorView* t : {&k, &v}) {
    if (t->rank() != q.rank()) {
      throw Error(t->name, "expected " + str(q.rank()) + " dims like " + q.name + ", got " +
                               str(t->rank()) + " " + shape_string(t->shape));
    }
  }
  const int rank = q.rank();
  AttentionShape shape;
  shape.b = rank == 4 ? q.dim(0) : 1;
  shape.h = rank >= 3 ? q.dim(-3) : 1;
  shape.hkv = rank >= 3 ? k.dim(-3) : 1;
  shape.nq = q.dim(-2);
  shape.nk = k.dim(-2);
  shape.d = q.dim(-1);
  shape.dv = v.dim(-1);

  if (rank == 4) {
    for (const TensorView* t : {&k, &v}) {
      if (t->dim(0) != shape.b) {
        throw Error(t->name, "batch size " + str(t->dim(0)) + " differs from " + q.name + "'s " +
                                 str(shape.b));
      }
    }
  }
  if (rank >= 3) {
    // No query heads is an empty call; kv heads must exist to serve query heads that do.
    if (shape.hkv == 0 && shape.h > 0) {
      throw Error(k.name, "has no heads (size 0), but " + q.name + "'s " + str(shape.h) +
                              " query heads each need one");
    }
    if (v.dim(-3) != shape.hkv) {
      throw Error(v.name,
                  "has " + str(v.dim(-3)) + " heads but " + k.name + " has " + str(shape.hkv));
    }
    if (shape.hkv > 0 && shape.h % shape.hkv != 0) {
      throw Error(k.name, str(shape.hkv) + " kv heads do not divide " + q.name + "'s " +
                              str(shape.h) + " query heads (H % Hkv must be 0)");
    }
  }
  if (k.dim(-1) != shape.d) {
    throw Error(k.name, "head dimension " + str(k.dim(-1)) + " differs from " + q.name + "'s " +
                            str(shape.d));
  }
  if (v.dim(-2) != shape.nk) {
    throw Error(v.name, "has " + str(v.dim(-2)) + " rows but " + k.name + " has " + str(shape.nk) +
                            " (one value per key)");
  }
  // The scan of the inputs is the one pass over all of them before the kernel: on the call's
  // threads (at n = 2048, d = 64, H = 8 it is ~2 ms of a 62-ms single-thread call).
  const int scan_threads = options.threads < 0 ? 1 : resolve_thread_count(options.threads);
  std::vector<double> magnitudes;
  if (defer_kv_scan) {
    magnitudes = require_finite({&q}, scan_threads);
    magnitudes.push_back(unflagged_bound(k));
    magnitudes.push_back(unflagged_bound(v));
  } else {
    magnitudes = require_finite({&q, &k, &v}, scan_threads);
  }

  AttentionCall call;
  call.kv_scan_deferred = defer_kv_scan;
  AttentionParams& p = call.params;
  p.shape = shape;
  p.q = {q.data, q.dtype, canonical_strides(q.strides)};
  p.k = {k.data, k.dtype, canonical_strides(k.strides)};
  p.v = {v.data, v.dtype, canonical_strides(v.strides)};
  p.magnitudes = {magnitudes[0], magnitudes[1], magnitudes[2], 0.0};

  apply_call_options(options, shape.d, p);
  // Every (query, key) pair's q·k and w·v, masks aside: what the kernels' threads share.
  p.threads = threads_for_work(options.threads,
                               static_cast<double>(shape.b) * static_cast<double>(shape.h) *
                                   static_cast<double>(shape.nq) * static_cast<double>(shape.nk) *
                                   static_cast<double>(shape.d + shape.dv));

  const Shape leading(q.shape.begin(), q.shape.end() - 2);
  call.out_shape = leading;
  call.out_shape.insert(call.out_shape.end(), {shape.nq, shape.dv});
  call.weights_shape = leading;
  call.weights_shape.insert(call.weights_shape.end(), {shape.nq, shape.nk});
  call.lse_shape = leading;
  call.lse_shape.push_back(shape.nq);

  if (options.mask) {
    const TensorView& mask = *options.mask;
    p.magnitudes.mask = validate_mask(mask);
    const Shape strides = broadcast_strides(
        mask, call.weights_shape,
        "the score shape " + shape_string(call.weights_shape) + " of " + q.name + " and " + k.name);
    p.masking.mask = mask.data;
    p.masking.mask_dtype = mask.dtype;
    p.masking.mask_strides = canonical_strides(strides);
  }
  apply_storage_type(options, p);
  // Deferred K and V get this check from scan_deferred_kv (a walk here would be the scan).
  require_within_storage_type(p.compute, {&q}, {&p.magnitudes.q});
  if (!defer_kv_scan) {
    require_within_storage_type(p.compute, {&k, &v}, {&p.magnitudes.k, &p.magnitudes.v});
  }
  apply_score_modifiers(options, p);
  apply_packed_batch(options, q, k, call);
  return call;
}

void scan_deferred_kv(AttentionCall& call, const TensorView& k, const TensorView& v,
                      const AttentionOptions& options) {
  if (!call.kv_scan_deferred) return;
  AttentionParams& p = call.params;
  const std::vector<double> magnitudes =
      require_finite({&k, &v}, options.threads < 0 ? 1 : resolve_thread_count(options.threads));
  p.magnitudes.k = magnitudes[0];
  p.magnitudes.v = magnitudes[1];
  require_within_storage_type(p.compute, {&k, &v}, {&p.magnitudes.k, &p.magnitudes.v});
  call.kv_scan_deferred = false;
}

void bind_output(OutputOperand& slot, const MutableTensorView& view, const Shape& expected,
                 bool has_columns) {
  if (view.dtype != DType::kF32 && view.dtype != DType::kF64) {
    throw Error(view.name, "output dtype must be float32 or float64");
  }
  if (view.shape != expected) {
    throw Error(view.name, "output shape " + shape_string(view.shape) + " should be " +
                               shape_string(expected));
  }
  if (view.strides.size() != view.shape.size()) {
    throw Error(view.name, "strides do not match the shape");
  }
  slot.data = view.data;
  slot.dtype = view.dtype;
  // The lse has no column dim: a zero column stride lets the canonical mapping apply.
  Shape strides = view.strides;
  if (!has_columns) strides.push_back(0);
  slot.strides = canonical_strides(strides);
}

}  // namespace qkv::core
