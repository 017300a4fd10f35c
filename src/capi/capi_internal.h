// What the C API's source files share: the exception guard every entry point runs in, reading
// the caller's size-stamped structs, and the conversions from qkv_tensor and
// qkv_attention_options to the C++ API's types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "core/out_of_memory.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/qkv_c.h"
#include "qkv/tensor.h"

struct qkv_result {
  qkv::Tensor out;
  qkv::Tensor weights;
  qkv::Tensor lse;
  qkv::Tensor dq, dk, dv, dsinks;  // qkv_attention_backward's parts
  // qkv_layer_backward's (and dsinks)
  qkv::Tensor dx, dmemory, dwq, dwk, dwv, dwo, dbq, dbk, dbv, dbo;
  std::string kernel;
};

namespace qkv::capi {

// Sets this thread's message and returns `status`; never throws.
qkv_status fail(qkv_status status, const char* message) noexcept;
void clear_error() noexcept;

// How a qkv::Error maps to a status: `otherwise` unless it is an allocation failure or a
// refusal by a bound the caller set.
qkv_status classify(const Error& error, qkv_status otherwise) noexcept;

// Runs `body` and turns whatever it throws into a status and this thread's message, so that no
// exception crosses into C. `errors` is the status of a qkv::Error that classify() does not
// single out (QKV_ERROR_FILE for the readers).
template <typename Body>
qkv_status guarded(Body&& body, qkv_status errors = QKV_ERROR_INVALID_ARGUMENT) noexcept {
  try {
    body();
    clear_error();
    return QKV_OK;
  } catch (const core::OutOfMemory& e) {
    return fail(QKV_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const Error& e) {
    return fail(classify(e, errors), e.what());
  } catch (const std::bad_alloc&) {
    return fail(QKV_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(QKV_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(QKV_ERROR_INTERNAL, "internal error: an unknown exception");
  }
}

// Throws qkv::Error(name, "must not be NULL") for a NULL pointer.
void require(const void* pointer, const char* name);

// The caller's struct_size, checked: at least one of `versions` (the sizes earlier headers had,
// oldest first; the last is this header's sizeof) exactly, or larger than the newest with every
// byte this library does not know zero. Returns how many bytes to read.
std::size_t checked_struct_size(const void* object, std::size_t struct_size,
                                std::initializer_list<std::size_t> versions, const char* name);

// Copies the fields of the caller's struct that fit in its (checked) struct_size over
// `defaults`, so a field an older client does not have keeps its default.
template <typename Struct>
Struct read_struct(const Struct* given, Struct defaults, const char* name,
                   std::initializer_list<std::size_t> versions = {sizeof(Struct)}) {
  require(given, name);
  const std::size_t size = checked_struct_size(given, given->struct_size, versions, name);
  std::memcpy(static_cast<void*>(&defaults), given, size < sizeof(Struct) ? size : sizeof(Struct));
  return defaults;
}

// An enum field of the caller's struct as the integer it holds. C lets any int be stored there;
// C++ may assume an enum holds only its enumerators' range, so fields are read as integers.
template <typename Enum>
std::int64_t enum_value(const Enum& field) noexcept {
  static_assert(sizeof(Enum) == sizeof(std::int32_t));
  std::int32_t value = 0;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

DType to_dtype(std::int64_t dtype, const std::string& subject);
qkv_dtype from_dtype(DType dtype) noexcept;

// A qkv_tensor as a view: `name` is the subject when the tensor carries none.
TensorView to_view(const qkv_tensor* tensor, const char* name);
MutableTensorView to_mutable_view(const qkv_tensor* tensor, const char* name);
std::optional<TensorView> to_optional_view(const qkv_tensor* tensor, const char* name);

// NULL gives the defaults.
AttentionOptions to_options(const qkv_attention_options* options);

// The tensors of an AttentionResult or a LayerResult, moved into a handle.
template <typename Result>
std::unique_ptr<qkv_result> make_result(Result&& r) {
  auto made = std::make_unique<qkv_result>();
  made->out = std::move(r.out);
  made->weights = std::move(r.weights);
  made->lse = std::move(r.lse);
  made->kernel = std::move(r.kernel);
  return made;
}

// A result is handed over only once complete, so a failed call leaves *result as it was.
inline void hand_over(std::unique_ptr<qkv_result> made, qkv_result** result) noexcept {
  *result = made.release();
}

}  // namespace qkv::capi
