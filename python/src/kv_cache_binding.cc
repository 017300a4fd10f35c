// qkv._qkv.KVCache and qkv._qkv.attention_cached: the paged cache of keys and values behind
// qkv.KVCache (python/qkv/_kv_cache.py, which names the arguments and documents them).
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "options.h"
#include "qkv/kv_cache.h"

namespace qkv::python {

namespace {

KVCache make_cache(std::int64_t kv_heads, std::int64_t d, std::optional<std::int64_t> dv,
                   const std::string& storage, std::int64_t page_rows, std::int64_t max_pages,
                   std::int64_t max_bytes) {
  if (max_pages < 0) throw Error("max_pages", "must be 0 (no bound) or more");
  if (max_bytes < 0) throw Error("max_bytes", "must be 0 (no bound) or more");
  KVCacheOptions options;
  options.kv_heads = kv_heads;
  options.d = d;
  options.dv = dv.value_or(d);
  options.storage = parse_cache_storage(storage, "storage");
  options.page_rows = page_rows;
  options.max_pages = max_pages;
  options.max_bytes = static_cast<std::uint64_t>(max_bytes);
  return KVCache(options);
}

void append(KVCache& cache, SequenceId sequence, const py::handle& k_in, const py::handle& v_in) {
  ArrayKeeper keeper;
  const TensorView k = view_of(k_in, "k", keeper);
  const TensorView v = view_of(v_in, "v", keeper);
  py::gil_scoped_release appending;
  cache.append(sequence, k, v);
}

py::tuple attention_cached_call(const py::handle& q_in, const KVCache& cache,
                                const std::vector<SequenceId>& sequences,
                                const py::dict& option_items) {
  ArrayKeeper keeper;
  const TensorView q = view_of(q_in, "q", keeper);
  const AttentionOptions options = attention_options(option_items, keeper);
  AttentionResult result;
  {
    py::gil_scoped_release computing;
    result = attention_cached(q, cache, sequences, options);
  }
  py::object lse = options.return_lse ? py::object(to_numpy(std::move(result.lse))) : py::none();
  return py::make_tuple(to_numpy(std::move(result.out)), lse, result.kernel);
}

}  // namespace

void register_kv_cache(py::module_& m) {
  py::class_<KVCache>(m, "KVCache", "See qkv.KVCache.")
      .def(py::init(&make_cache), py::arg("kv_heads"), py::arg("d"), py::arg("dv"),
           py::arg("storage"), py::arg("page_rows"), py::arg("max_pages"), py::arg("max_bytes"))
      .def("add_sequence", &KVCache::add_sequence)
      .def("fork", &KVCache::fork, py::arg("sequence"))
      .def("remove", &KVCache::remove, py::arg("sequence"))
      .def("contains", &KVCache::contains, py::arg("sequence"))
      .def("sequences", &KVCache::sequences)
      .def("append", &append, py::arg("sequence"), py::arg("k"), py::arg("v"))
      .def("forget_before", &KVCache::forget_before, py::arg("sequence"), py::arg("row"))
      .def("length", &KVCache::length, py::arg("sequence"))
      .def("first_stored_row", &KVCache::first_stored_row, py::arg("sequence"))
      .def("pages_in_use", &KVCache::pages_in_use)
      .def("page_bytes", &KVCache::page_bytes)
      .def("bytes_in_use", &KVCache::bytes_in_use)
      .def("storage",
           [](const KVCache& cache) { return cache_storage_name(cache.options().storage); })
      .def("shape",
           [](const KVCache& cache) {
             const KVCacheOptions& o = cache.options();
             return py::make_tuple(o.kv_heads, o.d, o.dv);
           })
      .def(
          "gather",
          [](const KVCache& cache, SequenceId sequence, bool values) {
            Tensor rows;
            {
              py::gil_scoped_release gathering;
              rows = cache.gather(sequence, values);
            }
            return to_numpy(std::move(rows));
          },
          py::arg("sequence"), py::arg("values"));
  m.def("attention_cached", &attention_cached_call, "See qkv.attention_cached.");
}

}  // namespace qkv::python
