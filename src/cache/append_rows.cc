#include "cache/append_rows.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "cache/quantise.h"
#include "core/half.h"
#include "core/mask_rule.h"
#include "qkv/error.h"

namespace qkv::cache {
namespace {

std::string str(std::int64_t n) { return std::to_string(n); }

// The shortest text that reads back as the same double: "70000", "1e+300", "0.1".
std::string number(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string index_string(const std::vector<std::int64_t>& index) {
  std::string text = "[";
  for (std::size_t i = 0; i < index.size(); ++i) text += (i ? ", " : "") + str(index[i]);
  return text + "]";
}

constexpr double kFloatMax = std::numeric_limits<float>::max();

const char* storage_range_name(CacheStorage storage) {
  switch (storage) {
    case CacheStorage::kBF16:
      return "bfloat16";
    case CacheStorage::kF16:
      return "float16";
    case CacheStorage::kF32:
    case CacheStorage::kInt8:
      return "float32";  // int8 holds q · a float32 scale
  }
  return "float32";
}

// The magnitude a page gives back for x: |x| rounded to the storage type; for int8, the
// largest a block whose largest magnitude is |x| holds (127 · scale, read back exactly as
// quantise.h says), which bounds x's own q · scale and grows with |x|. Its maximum over an
// operand is therefore the largest magnitude the pages hold of it.
double held_magnitude(CacheStorage storage, float x) noexcept {
  const float magnitude = std::fabs(x);
  switch (storage) {
    case CacheStorage::kF32:
      return magnitude;
    case CacheStorage::kBF16:
      return core::bf16_to_float(core::float_to_bf16(magnitude));
    case CacheStorage::kF16:
      return core::f16_to_float(core::float_to_f16(magnitude));
    case CacheStorage::kInt8:
      return 127.0 * static_cast<double>(int8_block_scale(&magnitude, 1));
  }
  return magnitude;
}

}  // namespace

float to_storage_float(CacheStorage storage, double value) noexcept {
  // 16-bit storage rounds once from the input (see narrow_to_odd), float32 and int8 from the
  // value rounded to float32.
  return storage == CacheStorage::kF16 || storage == CacheStorage::kBF16
             ? core::narrow_to_odd(value)
             : static_cast<float>(value);
}

Operand check_operand(const TensorView& view, const char* role, const char* width_name,
                      std::int64_t width, std::int64_t n, std::int64_t hkv, CacheStorage storage) {
  Operand op;
  op.view = &view;
  op.name = view.name.empty() ? role : view.name;
  op.width = width;
  if (view.dtype != DType::kF32 && view.dtype != DType::kF64 && view.dtype != DType::kBF16 &&
      view.dtype != DType::kF16) {
    throw Error(op.name, std::string("dtype ") + dtype_name(view.dtype) +
                             " cannot be cached (float32, float64, bfloat16 or float16)");
  }
  if (view.strides.size() != view.shape.size()) {
    throw Error(op.name, "has " + str(view.rank()) + " dims but " +
                             str(static_cast<std::int64_t>(view.strides.size())) + " strides");
  }
  const bool rank_ok = view.rank() == 3 || (hkv == 1 && view.rank() == 2);
  const int r = view.rank();
  const std::int64_t heads = r == 3 ? view.shape[0] : 1;
  if (!rank_ok || heads != hkv || view.dim(-1) != width || (n >= 0 && view.dim(-2) != n) ||
      view.dim(-2) < 0) {
    const std::string rows = n >= 0 ? "n=" + str(n) : "n";
    const std::string tail = rows + ", " + width_name + "=" + str(width) + "]";
    std::string expected = "[Hkv=" + str(hkv) + ", " + tail;
    if (hkv == 1) expected += " or [" + tail;
    throw Error(op.name, "expected " + expected + (n >= 0 ? " like k" : "") + ", got " +
                             shape_string(view.shape));
  }
  op.n = view.dim(-2);
  op.s_head = r == 3 ? view.strides[0] : 0;
  op.s_row = view.strides[static_cast<std::size_t>(r - 2)];
  op.s_col = view.strides[static_cast<std::size_t>(r - 1)];
  if (view.data == nullptr && hkv * op.n * width > 0) throw Error(op.name, "has no data");

  // Each value is refused unless the page holds it finitely, as the kernels and gather read it
  // back: finite after rounding to float32 and, through the very conversions store_row makes,
  // after rounding to bfloat16 or float16 (int8 holds every finite float32: quantise.cc). The
  // check comes here, before the cache changes, rather than in every later call on the
  // sequence. max_abs is of the values held, which the kernels' float32 range checks use.
  const auto refuse = [&](std::int64_t hk, std::int64_t i, std::int64_t c, double value,
                          const char* range) {
    std::vector<std::int64_t> index;
    if (r == 3) index.push_back(hk);
    index.push_back(i);
    index.push_back(c);
    if (!std::isfinite(value)) {
      throw Error(op.name, std::string(std::isnan(value) ? "NaN" : "an infinity") + " at " +
                               index_string(index) + " (cached values must be finite)");
    }
    throw Error(op.name, "value " + number(value) + " at " + index_string(index) + " is outside " +
                             range + "'s range");
  };
  // held_magnitude grows with |x|: only a magnitude larger than every earlier one can be the
  // first to pass FLT_MAX or raise max_abs, so it is converted only then.
  float largest = -1.0f;
  for (std::int64_t hk = 0; hk < hkv; ++hk) {
    for (std::int64_t i = 0; i < op.n; ++i) {
      for (std::int64_t c = 0; c < width; ++c) {
        const double value = core::load_real(view.data, view.dtype, op.offset(hk, i, c));
        const float x = to_storage_float(storage, value);
        if (!std::isfinite(x)) refuse(hk, i, c, value, "float32");
        if (std::fabs(x) <= largest) continue;
        largest = std::fabs(x);
        const double held = held_magnitude(storage, x);
        if (!(held <= kFloatMax)) refuse(hk, i, c, value, storage_range_name(storage));
        op.max_abs = held;
      }
    }
  }
  return op;
}

void write_rows(const PageLayout& layout, const std::vector<std::byte*>& pages,
                std::int64_t first_page_row, std::int64_t row0, const Operand& op, bool values,
                std::vector<float>& scratch) noexcept {
  const std::int64_t element_bytes = storage_bytes(layout.storage);
  const std::int64_t blocks = values ? layout.v_blocks() : layout.k_blocks();
  for (std::int64_t hk = 0; hk < layout.hkv; ++hk) {
    const std::int64_t head_offset = values ? layout.v_offset(hk) : layout.k_offset(hk);
    const std::int64_t scale_offset =
        values ? layout.v_scale_offset(hk) : layout.k_scale_offset(hk);
    for (std::int64_t i = 0; i < op.n; ++i) {
      const std::int64_t p = row0 + i;
      std::byte* page = pages[static_cast<std::size_t>((p - first_page_row) / layout.page_rows)];
      const std::int64_t r = p % layout.page_rows;
      for (std::int64_t c = 0; c < op.width; ++c) {
        const double value = core::load_real(op.view->data, op.view->dtype, op.offset(hk, i, c));
        scratch[static_cast<std::size_t>(c)] = to_storage_float(layout.storage, value);
      }
      store_row(layout.storage, scratch.data(), op.width,
                page + head_offset + r * op.width * element_bytes,
                reinterpret_cast<float*>(page + scale_offset) + r * blocks);
    }
  }
}

}  // namespace qkv::cache
