// The C API's plumbing: this thread's message, the status names, size-stamped structs, and
// qkv_tensor / qkv_attention_options as the C++ API's types.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "capi/capi_internal.h"

namespace qkv::capi {
namespace {

// Set by the failing call, read by qkv_last_error() on the same thread. The fallback is for the
// one case where copying the message itself cannot allocate.
thread_local std::string last_message;
thread_local const char* last_fallback = nullptr;

// A struct_size past this is taken for an uninitialised field rather than read byte by byte.
constexpr std::size_t kMaxStructSize = 4096;

std::string str(std::int64_t value) { return std::to_string(value); }

}  // namespace

qkv_status fail(qkv_status status, const char* message) noexcept {
  try {
    last_message = message;
    last_fallback = nullptr;
  } catch (...) {
    last_fallback = "out of memory (while recording an error)";
  }
  return status;
}

void clear_error() noexcept {
  last_message.clear();
  last_fallback = nullptr;
}

qkv_status classify(const Error& error, qkv_status otherwise) noexcept {
  // The subjects attention.h and kv_cache.h document for these refusals; a caller can act on
  // them (raise the budget, evict a sequence), so they get a status of their own.
  if (error.subject() == "max_memory" || error.subject() == "KVCache capacity") {
    return QKV_ERROR_LIMIT;
  }
  // Allocation failures the library reports as a plain qkv::Error (a kernel's workspace, a
  // reader's buffer) all say so in these words (core/out_of_memory.h).
  if (error.problem().starts_with("out of memory")) return QKV_ERROR_OUT_OF_MEMORY;
  return otherwise;
}

void require(const void* pointer, const char* name) {
  if (pointer == nullptr) throw Error(name, "must not be NULL");
}

std::size_t checked_struct_size(const void* object, std::size_t struct_size,
                                std::initializer_list<std::size_t> versions, const char* name) {
  const std::size_t oldest = *versions.begin();
  const std::size_t newest = *(versions.end() - 1);
  if (struct_size < oldest) {
    throw Error(name, "struct_size " + std::to_string(struct_size) +
                          " is smaller than the first version's " + std::to_string(oldest) +
                          " bytes (was it set? the _init function sets it)");
  }
  if (struct_size > kMaxStructSize) {
    throw Error(name, "struct_size " + std::to_string(struct_size) +
                          " is implausibly large (was it set? the _init function sets it)");
  }
  if (struct_size > newest) {
    const auto* bytes = static_cast<const unsigned char*>(object);
    for (std::size_t i = newest; i < struct_size; ++i) {
      if (bytes[i] != 0) {
        throw Error(name, "struct_size " + std::to_string(struct_size) +
                              " comes from a newer qkv whose fields this library (" +
                              std::to_string(newest) + " bytes) does not know, and they are set");
      }
    }
    return newest;
  }
  for (const std::size_t size : versions) {
    if (size == struct_size) return size;
  }
  throw Error(name, "struct_size " + std::to_string(struct_size) +
                        " is not the size of any version of this struct");
}

DType to_dtype(std::int64_t dtype, const std::string& subject) {
  switch (dtype) {
    case QKV_F32:
      return DType::kF32;
    case QKV_F64:
      return DType::kF64;
    case QKV_BOOL:
      return DType::kBool;
    case QKV_BF16:
      return DType::kBF16;
    case QKV_F16:
      return DType::kF16;
    case QKV_I32:
      return DType::kI32;
    case QKV_I64:
      return DType::kI64;
    default:
      break;
  }
  throw Error(subject, "dtype " + str(dtype) + " is not a qkv_dtype (QKV_F32 .. QKV_I64)");
}

qkv_dtype from_dtype(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32:
      return QKV_F32;
    case DType::kF64:
      return QKV_F64;
    case DType::kBool:
      return QKV_BOOL;
    case DType::kBF16:
      return QKV_BF16;
    case DType::kF16:
      return QKV_F16;
    case DType::kI32:
      return QKV_I32;
    case DType::kI64:
      return QKV_I64;
  }
  return QKV_F32;
}

namespace {

// The checks C needs that a C++ caller's vectors make unnecessary: the pointers, the rank, and
// memory behind every non-empty tensor.
template <typename View>
View make_view(const qkv_tensor* tensor, const char* name) {
  require(tensor, name);
  const qkv_tensor t = read_struct(tensor, qkv_tensor{}, name);
  View view;
  view.name = t.name != nullptr ? t.name : name;
  view.dtype = to_dtype(enum_value(t.dtype), view.name);
  if (t.rank < 0 || t.rank > QKV_MAX_RANK) {
    throw Error(view.name, "rank " + str(t.rank) + " is outside 0 .. " + str(QKV_MAX_RANK));
  }
  if (t.rank > 0 && t.shape == nullptr) throw Error(view.name, "shape must not be NULL");
  const auto rank = static_cast<std::size_t>(t.rank);
  view.shape.assign(t.shape, t.shape + rank);
  for (std::size_t axis = 0; axis < rank; ++axis) {
    if (view.shape[axis] < 0) {
      throw Error(view.name, "shape " + shape_string(view.shape) + " has a negative dimension");
    }
  }
  view.strides =
      t.strides != nullptr ? Shape(t.strides, t.strides + rank) : contiguous_strides(view.shape);
  if (t.data == nullptr && shape_numel(view.shape, view.name) > 0) {
    throw Error(view.name,
                "data must not be NULL for " + str(shape_numel(view.shape)) + " elements");
  }
  view.data = t.data;
  return view;
}

}  // namespace

TensorView to_view(const qkv_tensor* tensor, const char* name) {
  return make_view<TensorView>(tensor, name);
}

MutableTensorView to_mutable_view(const qkv_tensor* tensor, const char* name) {
  return make_view<MutableTensorView>(tensor, name);
}

std::optional<TensorView> to_optional_view(const qkv_tensor* tensor, const char* name) {
  if (tensor == nullptr) return std::nullopt;
  return to_view(tensor, name);
}

AttentionOptions to_options(const qkv_attention_options* options) {
  AttentionOptions result;
  if (options == nullptr) return result;
  qkv_attention_options defaults;
  qkv_attention_options_init(&defaults);
  const qkv_attention_options o = read_struct(
      options, defaults, "options", {QKV_ATTENTION_OPTIONS_V1_SIZE, QKV_ATTENTION_OPTIONS_V2_SIZE,
                                    QKV_ATTENTION_OPTIONS_V3_SIZE, sizeof(qkv_attention_options)});
  if (o.has_scale) result.scale = o.scale;
  result.causal = o.causal != 0;
  if (o.has_window) result.window = Window{o.window_left, o.window_right};
  result.mask = to_optional_view(o.mask, "mask");
  result.return_weights = o.return_weights != 0;
  result.return_lse = o.return_lse != 0;
  result.out_dtype = to_dtype(enum_value(o.out_dtype), "out_dtype");
  result.threads = o.threads;
  if (o.kernel != nullptr) result.kernel = o.kernel;
  result.max_memory = o.max_memory;
  if (enum_value(o.dtype) != QKV_DTYPE_DEFAULT)
    result.dtype = to_dtype(enum_value(o.dtype), "dtype");
  // The C++ API's "none" for softcap is an empty optional; 0 is not a valid cap, so it is C's.
  if (o.softcap != 0.0) result.softcap = o.softcap;
  result.alibi = o.alibi != 0;
  result.alibi_slopes = to_optional_view(o.alibi_slopes, "alibi_slopes");
  result.sinks = to_optional_view(o.sinks, "sinks");
  result.cu_seqlens_q = to_optional_view(o.cu_seqlens_q, "cu_seqlens_q");
  result.cu_seqlens_k = to_optional_view(o.cu_seqlens_k, "cu_seqlens_k");
  result.dropout_p = o.dropout_p;
  result.seed = o.seed;
  result.dropout_offset = o.dropout_offset;
  if (enum_value(o.grad_dtype) != QKV_DTYPE_DEFAULT)
    result.grad_dtype = to_dtype(enum_value(o.grad_dtype), "grad_dtype");
  return result;
}

}  // namespace qkv::capi

extern "C" {

const char* qkv_status_name(qkv_status status) {
  switch (qkv::capi::enum_value(status)) {
    case QKV_OK:
      return "QKV_OK";
    case QKV_ERROR_INVALID_ARGUMENT:
      return "QKV_ERROR_INVALID_ARGUMENT";
    case QKV_ERROR_FILE:
      return "QKV_ERROR_FILE";
    case QKV_ERROR_OUT_OF_MEMORY:
      return "QKV_ERROR_OUT_OF_MEMORY";
    case QKV_ERROR_LIMIT:
      return "QKV_ERROR_LIMIT";
    case QKV_ERROR_INTERNAL:
      return "QKV_ERROR_INTERNAL";
  }
  return "unknown status";
}

const char* qkv_last_error(void) {
  return qkv::capi::last_fallback != nullptr ? qkv::capi::last_fallback
                                             : qkv::capi::last_message.c_str();
}

const char* qkv_version(void) { return qkv::version(); }

}  // extern "C"
