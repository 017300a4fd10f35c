#include "cache/append_rows.h"

#include <charconv>
#include <cmath>

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

}  // namespace

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

  const char* range_name = storage == CacheStorage::kF16 ? "float16" : "float32";
  for (std::int64_t hk = 0; hk < hkv; ++hk) {
    for (std::int64_t i = 0; i < op.n; ++i) {
      for (std::int64_t c = 0; c < width; ++c) {
        const double value = core::load_real(view.data, view.dtype, op.offset(hk, i, c));
        // 16-bit storage rounds once from the input (see narrow_to_odd), float32 and int8 from
        // the value rounded to float32.
        const float rounded = storage == CacheStorage::kF16 || storage == CacheStorage::kBF16
                                  ? core::narrow_to_odd(value)
                                  : static_cast<float>(value);
        op.max_abs = std::max(op.max_abs, std::fabs(value));
        const bool finite = std::isfinite(value);
        const bool in_range = std::isfinite(rounded) &&
                              (storage != CacheStorage::kF16 || std::fabs(rounded) < 65520.0f);
        if (finite && in_range) continue;
        std::vector<std::int64_t> index;
        if (r == 3) index.push_back(hk);
        index.push_back(i);
        index.push_back(c);
        throw Error(op.name, finite
                                 ? "value " + number(value) + " at " + index_string(index) +
                                       " is outside " + range_name + "'s range"
                                 : std::string(std::isnan(value) ? "NaN" : "an infinity") + " at " +
                                       index_string(index) + " (cached values must be finite)");
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
        scratch[static_cast<std::size_t>(c)] =
            layout.storage == CacheStorage::kF16 || layout.storage == CacheStorage::kBF16
                ? core::narrow_to_odd(value)
                : static_cast<float>(value);
      }
      store_row(layout.storage, scratch.data(), op.width,
                page + head_offset + r * op.width * element_bytes,
                reinterpret_cast<float*>(page + scale_offset) + r * blocks);
    }
  }
}

}  // namespace qkv::cache
