// The C API's attention, layer (and both backwards), result handles and reader: each entry point converts its
// arguments (capi_convert.cc), calls the C++ API, and turns any exception into a status.
#include "qkv/qkv_c.h"

#include <memory>
#include <optional>
#include <utility>

#include "capi/capi_internal.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/io.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"

using qkv::capi::guarded;
using qkv::capi::hand_over;
using qkv::capi::make_result;
using qkv::capi::require;

extern "C" {

qkv_status qkv_result_tensor(const qkv_result* result, qkv_result_part part, qkv_tensor* view) {
  return guarded([&] {
    require(result, "result");
    require(view, "view");
    // Checked now, written at the end: the caller's view is untouched on error.
    qkv::capi::checked_struct_size(view, view->struct_size, {sizeof(qkv_tensor)}, "view");
    const qkv::Tensor* tensor = nullptr;
    const char* what = "";
    switch (qkv::capi::enum_value(part)) {
      case QKV_RESULT_OUT:
        tensor = &result->out, what = "out";
        break;
      case QKV_RESULT_WEIGHTS:
        tensor = &result->weights, what = "weights";
        break;
      case QKV_RESULT_LSE:
        tensor = &result->lse, what = "lse";
        break;
      case QKV_RESULT_DQ:
        tensor = &result->dq, what = "dq";
        break;
      case QKV_RESULT_DK:
        tensor = &result->dk, what = "dk";
        break;
      case QKV_RESULT_DV:
        tensor = &result->dv, what = "dv";
        break;
      case QKV_RESULT_DSINKS:
        tensor = &result->dsinks, what = "dsinks";
        break;
      case QKV_RESULT_DX:
        tensor = &result->dx, what = "dx";
        break;
      case QKV_RESULT_DMEMORY:
        tensor = &result->dmemory, what = "dmemory";
        break;
      case QKV_RESULT_DWQ:
        tensor = &result->dwq, what = "dwq";
        break;
      case QKV_RESULT_DWK:
        tensor = &result->dwk, what = "dwk";
        break;
      case QKV_RESULT_DWV:
        tensor = &result->dwv, what = "dwv";
        break;
      case QKV_RESULT_DWO:
        tensor = &result->dwo, what = "dwo";
        break;
      case QKV_RESULT_DBQ:
        tensor = &result->dbq, what = "dbq";
        break;
      case QKV_RESULT_DBK:
        tensor = &result->dbk, what = "dbk";
        break;
      case QKV_RESULT_DBV:
        tensor = &result->dbv, what = "dbv";
        break;
      case QKV_RESULT_DBO:
        tensor = &result->dbo, what = "dbo";
        break;
      default:
        throw qkv::Error("part",
                         std::to_string(qkv::capi::enum_value(part)) + " is not a qkv_result_part");
    }
    if (tensor->empty()) {
      const bool optional = tensor == &result->weights || tensor == &result->lse;
      throw qkv::Error(what, optional ? std::string("is not in this result (set options.return_") +
                                            what + ")"
                                      : "is not in this result");
    }
    view->data = const_cast<void*>(tensor->data());
    view->dtype = qkv::capi::from_dtype(tensor->dtype());
    view->rank = static_cast<int32_t>(tensor->shape().size());
    view->shape = tensor->shape().data();
    view->strides = nullptr;
    view->name = tensor->name().c_str();
  });
}

const char* qkv_result_kernel(const qkv_result* result) {
  return result != nullptr ? result->kernel.c_str() : nullptr;
}

void qkv_result_free(qkv_result* result) { delete result; }

qkv_status qkv_attention_into(const qkv_tensor* q, const qkv_tensor* k, const qkv_tensor* v,
                              const qkv_attention_options* options, const qkv_tensor* out,
                              const qkv_tensor* weights, const qkv_tensor* lse) {
  return guarded([&] {
    qkv::AttentionOutputs outputs{qkv::capi::to_mutable_view(out, "out"), std::nullopt,
                                  std::nullopt};
    if (weights != nullptr) outputs.weights = qkv::capi::to_mutable_view(weights, "weights");
    if (lse != nullptr) outputs.lse = qkv::capi::to_mutable_view(lse, "lse");
    qkv::attention_into(qkv::capi::to_view(q, "q"), qkv::capi::to_view(k, "k"),
                        qkv::capi::to_view(v, "v"), qkv::capi::to_options(options), outputs);
  });
}

qkv_status qkv_attention(const qkv_tensor* q, const qkv_tensor* k, const qkv_tensor* v,
                         const qkv_attention_options* options, qkv_result** result) {
  return guarded([&] {
    require(result, "result");
    hand_over(
        make_result(qkv::attention(qkv::capi::to_view(q, "q"), qkv::capi::to_view(k, "k"),
                                   qkv::capi::to_view(v, "v"), qkv::capi::to_options(options))),
        result);
  });
}

qkv_status qkv_attention_backward(const qkv_tensor* q, const qkv_tensor* k, const qkv_tensor* v,
                                  const qkv_tensor* out, const qkv_tensor* lse,
                                  const qkv_tensor* grad_out,
                                  const qkv_attention_options* options, qkv_result** result) {
  return guarded([&] {
    require(result, "result");
    qkv::AttentionGradients g = qkv::attention_backward(
        qkv::capi::to_view(q, "q"), qkv::capi::to_view(k, "k"), qkv::capi::to_view(v, "v"),
        qkv::capi::to_view(out, "out"), qkv::capi::to_view(lse, "lse"),
        qkv::capi::to_view(grad_out, "grad_out"), qkv::capi::to_options(options));
    auto made = std::make_unique<qkv_result>();
    made->dq = std::move(g.dq);
    made->dk = std::move(g.dk);
    made->dv = std::move(g.dv);
    made->dsinks = std::move(g.dsinks);
    made->kernel = std::move(g.kernel);
    hand_over(std::move(made), result);
  });
}

namespace {

// The caller's layer structs as the C++ API's.
struct LayerCall {
  qkv::LayerWeights weights;
  qkv::LayerOptions options;
};

LayerCall layer_call(const qkv_layer_weights* weights, const qkv_layer_options* options) {
  qkv_layer_weights no_weights;
  qkv_layer_weights_init(&no_weights);
  const qkv_layer_weights w = qkv::capi::read_struct(weights, no_weights, "weights");
  qkv_layer_options default_options;
  qkv_layer_options_init(&default_options);
  const qkv_layer_options o = qkv::capi::read_struct(options, default_options, "options");

  LayerCall call{{qkv::capi::to_view(w.wq, "wq"), qkv::capi::to_view(w.wk, "wk"),
                  qkv::capi::to_view(w.wv, "wv")},
                 {}};
  call.weights.wo = qkv::capi::to_optional_view(w.wo, "wo");
  call.weights.bq = qkv::capi::to_optional_view(w.bq, "bq");
  call.weights.bk = qkv::capi::to_optional_view(w.bk, "bk");
  call.weights.bv = qkv::capi::to_optional_view(w.bv, "bv");
  call.weights.bo = qkv::capi::to_optional_view(w.bo, "bo");
  call.options.heads = o.heads;
  call.options.kv_heads = o.kv_heads;
  call.options.attention = qkv::capi::to_options(o.attention);
  return call;
}

}  // namespace

qkv_status qkv_multi_head_attention(const qkv_tensor* x, const qkv_layer_weights* weights,
                                    const qkv_layer_options* options, const qkv_tensor* memory,
                                    qkv_result** result) {
  return guarded([&] {
    require(result, "result");
    const LayerCall call = layer_call(weights, options);
    qkv::LayerResult r =
        qkv::multi_head_attention(qkv::capi::to_view(x, "x"), call.weights, call.options,
                                  qkv::capi::to_optional_view(memory, "memory"));
    hand_over(make_result(std::move(r)), result);
  });
}

qkv_status qkv_layer_backward(const qkv_tensor* x, const qkv_layer_weights* weights,
                              const qkv_layer_options* options, const qkv_tensor* memory,
                              const qkv_tensor* grad_out, qkv_result** result) {
  return guarded([&] {
    require(result, "result");
    const LayerCall call = layer_call(weights, options);
    qkv::LayerGradients g = qkv::multi_head_attention_backward(
        qkv::capi::to_view(x, "x"), call.weights, call.options,
        qkv::capi::to_view(grad_out, "grad_out"), qkv::capi::to_optional_view(memory, "memory"));
    auto made = std::make_unique<qkv_result>();
    made->dx = std::move(g.dx);
    made->dmemory = std::move(g.dmemory);
    made->dwq = std::move(g.dwq);
    made->dwk = std::move(g.dwk);
    made->dwv = std::move(g.dwv);
    made->dwo = std::move(g.dwo);
    made->dbq = std::move(g.dbq);
    made->dbk = std::move(g.dbk);
    made->dbv = std::move(g.dbv);
    made->dbo = std::move(g.dbo);
    made->dsinks = std::move(g.dsinks);
    made->kernel = std::move(g.kernel);
    hand_over(std::move(made), result);
  });
}

qkv_status qkv_use_openmp_threads(const char* library) {
  return guarded([&] { qkv::use_openmp_threads(library == nullptr ? "" : library); });
}

qkv_status qkv_read_npy(const char* path, qkv_result** result) {
  // Arguments first, as invalid arguments: only the reading itself is a file error.
  if (const qkv_status status = guarded([&] {
        require(path, "path");
        require(result, "result");
      });
      status != QKV_OK) {
    return status;
  }
  return guarded(
      [&] {
        auto made = std::make_unique<qkv_result>();
        made->out = qkv::read_npy(path);
        hand_over(std::move(made), result);
      },
      QKV_ERROR_FILE);
}

}  // extern "C"
