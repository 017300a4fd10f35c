// The attention options every binding takes from Python (attention, the layer, explain, the KV
// cache, timing), read from the one dict python/qkv/_options.py builds, so that every surface
// spells, defaults and checks them alike.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "arrays.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/layer.h"

namespace qkv::python {

// The value under `key`, or None when the key is absent: one lookup, no Python string made.
inline py::handle item_or_none(const py::dict& options, const char* key) {
  PyObject* value = PyDict_GetItemString(options.ptr(), key);  // borrowed; NULL if absent
  return value == nullptr ? py::handle(Py_None) : py::handle(value);
}

inline bool has_item(const py::dict& options, const char* key) {
  return !item_or_none(options, key).is_none();
}

// What a value of type T is called in a message.
template <typename T>
constexpr const char* kind_of() {
  if constexpr (std::is_same_v<T, bool>) return "True or False";
  if constexpr (std::is_same_v<T, double>) return "a number";
  if constexpr (std::is_unsigned_v<T>) return "a whole number, 0 or more";
  if constexpr (std::is_integral_v<T>) return "a whole number";
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  return "a tuple";
}

// `value` as a T, or a qkv::Error naming `subject` (pybind11's own cast error names nothing).
template <typename T>
T cast_as(const py::handle& value, const std::string& subject) {
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
    std::string shown = py::repr(value).cast<std::string>();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    throw Error(subject, std::string("expected ") + kind_of<T>() + ", got " + shown);
  }
}

inline int thread_option(const py::handle& threads) {
  if (threads.is_none()) return 0;
  const auto count = cast_as<std::int64_t>(threads, "threads");
  if (count < 0 || count > std::numeric_limits<int>::max()) {
    throw Error("threads",
                "must be 0 (one per hardware thread) or more, got " + std::to_string(count));
  }
  return static_cast<int>(count);
}

template <typename T>
std::optional<T> optional_item(const py::dict& options, const char* key) {
  const py::handle value = item_or_none(options, key);
  if (value.is_none()) return std::nullopt;
  return cast_as<T>(value, key);
}

// Outputs follow the inputs, as torch's do: float64 or float16 when every given view is stored
// so, else float32 (mixed dtypes, bfloat16 bits, which NumPy cannot hold).
inline DType default_out_dtype(std::initializer_list<const TensorView*> views) {
  std::optional<DType> common;
  for (const TensorView* view : views) {
    if (view == nullptr) continue;
    if (common && *common != view->dtype) return DType::kF32;
    common = view->dtype;
  }
  return common && (*common == DType::kF64 || *common == DType::kF16) ? *common : DType::kF32;
}

// Keys (all optional): attn_mask, is_causal, scale, window (left, right; -1 unbounded),
// softcap, alibi (True: the standard slopes), alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k,
// dtype, out_dtype (absent: kF32; callers apply default_out_dtype), grad_dtype, return_lse,
// return_weights, threads, kernel, max_memory, dropout_p, seed, dropout_offset. The arrays stay
// alive in `keeper`.
inline AttentionOptions attention_options(const py::dict& options, ArrayKeeper& keeper) {
  AttentionOptions result;
  result.mask = optional_view_of(item_or_none(options, "attn_mask"), "attn_mask", keeper);
  result.causal = optional_item<bool>(options, "is_causal").value_or(false);
  result.scale = optional_item<double>(options, "scale");
  if (const auto window = optional_item<py::tuple>(options, "window")) {
    if (window->size() != 2) throw Error("window", "expected (left, right)");
    result.window = Window{cast_as<std::int64_t>((*window)[0], "window"),
                           cast_as<std::int64_t>((*window)[1], "window")};
  }
  result.softcap = optional_item<double>(options, "softcap");
  result.alibi = optional_item<bool>(options, "alibi").value_or(false);
  result.alibi_slopes =
      optional_view_of(item_or_none(options, "alibi_slopes"), "alibi_slopes", keeper);
  result.sinks = optional_view_of(item_or_none(options, "sinks"), "sinks", keeper);
  result.cu_seqlens_q =
      optional_view_of(item_or_none(options, "cu_seqlens_q"), "cu_seqlens_q", keeper);
  result.cu_seqlens_k =
      optional_view_of(item_or_none(options, "cu_seqlens_k"), "cu_seqlens_k", keeper);
  if (const auto dtype = optional_item<std::string>(options, "dtype")) {
    result.dtype = parse_dtype(*dtype, "dtype");
  }
  if (const auto out_dtype = optional_item<std::string>(options, "out_dtype")) {
    result.out_dtype = parse_dtype(*out_dtype, "out_dtype");
  }
  if (const auto grad_dtype = optional_item<std::string>(options, "grad_dtype")) {
    result.grad_dtype = parse_dtype(*grad_dtype, "grad_dtype");
  }
  result.return_lse = optional_item<bool>(options, "return_lse").value_or(false);
  result.return_weights = optional_item<bool>(options, "return_weights").value_or(false);
  result.threads = thread_option(item_or_none(options, "threads"));
  result.kernel = optional_item<std::string>(options, "kernel").value_or("");
  result.max_memory = optional_item<std::uint64_t>(options, "max_memory").value_or(0);
  // Checked as integers in range by python/qkv/_options.py; dropout_p by validation.
  result.dropout_p = optional_item<double>(options, "dropout_p").value_or(0.0);
  result.seed = optional_item<std::uint64_t>(options, "seed").value_or(0);
  result.dropout_offset = optional_item<std::uint32_t>(options, "dropout_offset").value_or(0);
  return result;
}

// One attention call's inputs as qkv.attention passes them: the views of q, k, v and the options,
// with the output dtype following the inputs unless the dict names one.
struct AttentionCallInputs {
  TensorView q, k, v;
  AttentionOptions options;
};

inline AttentionCallInputs attention_call_inputs(const py::handle& q, const py::handle& k,
                                                 const py::handle& v, const py::dict& options,
                                                 ArrayKeeper& keeper) {
  AttentionCallInputs call{view_of(q, "q", keeper), view_of(k, "k", keeper),
                           view_of(v, "v", keeper), attention_options(options, keeper)};
  if (!has_item(options, "out_dtype")) {
    call.options.out_dtype = default_out_dtype({&call.q, &call.k, &call.v});
  }
  return call;
}

// `weights` is the tuple (wq, wk, wv, wo, bq, bk, bv, bo), None for those left out.
inline LayerWeights layer_weights(const py::tuple& weights, ArrayKeeper& keeper) {
  if (weights.size() != 8) throw Error("weights", "expected (wq, wk, wv, wo, bq, bk, bv, bo)");
  LayerWeights result{view_of(weights[0], "wq", keeper), view_of(weights[1], "wk", keeper),
                      view_of(weights[2], "wv", keeper)};
  result.wo = optional_view_of(weights[3], "wo", keeper);
  result.bq = optional_view_of(weights[4], "bq", keeper);
  result.bk = optional_view_of(weights[5], "bk", keeper);
  result.bv = optional_view_of(weights[6], "bv", keeper);
  result.bo = optional_view_of(weights[7], "bo", keeper);
  return result;
}

inline LayerOptions layer_options(std::int64_t heads, std::int64_t kv_heads,
                                  const py::dict& options, ArrayKeeper& keeper) {
  LayerOptions result;
  result.heads = heads;
  result.kv_heads = kv_heads;
  result.attention = attention_options(options, keeper);
  return result;
}

}  // namespace qkv::python
