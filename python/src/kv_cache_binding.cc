// qkv._qkv.KVCache and qkv._qkv.attention_cached: the paged cache of keys and values behind
// qkv.KVCache (python/qkv/_kv_cache.py, which names the arguments and documents them).
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
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

// qkv::KVCache takes concurrent calls on distinct sequences only, and a call on a sequence that
// another thread is appending to is undefined; from Python, any thread may call anything at any
// time (the GIL is released while the cache works). So each call that reads or writes a
// sequence's rows takes that sequence's lock, after releasing the GIL (a thread waiting here
// holds no lock that a thread holding the GIL waits for), and several in ascending order (two
// calls never wait for each other). Calls on distinct sequences still run at once.
class SequenceLocks {
 public:
  // The locks of some sequences, held until destroyed.
  class Held {
   private:
    friend class SequenceLocks;
    // Declared first, destroyed last: a removed sequence's mutex lives until its holder unlocks.
    std::vector<std::shared_ptr<std::mutex>> mutexes_;
    std::vector<std::unique_lock<std::mutex>> locks_;
  };

  Held lock(std::vector<SequenceId> sequences) {
    std::sort(sequences.begin(), sequences.end());
    sequences.erase(std::unique(sequences.begin(), sequences.end()), sequences.end());
    Held held;
    {
      const std::lock_guard guard(table_);
      for (const SequenceId s : sequences) {
        auto& slot = mutexes_[s];
        if (!slot) slot = std::make_shared<std::mutex>();
        held.mutexes_.push_back(slot);
      }
    }
    for (const auto& m : held.mutexes_) held.locks_.emplace_back(*m);
    return held;
  }

  // After remove(): a later call on the sequence is refused by the cache itself.
  void forget(SequenceId sequence) {
    const std::lock_guard guard(table_);
    mutexes_.erase(sequence);
  }

 private:
  std::mutex table_;
  std::map<SequenceId, std::shared_ptr<std::mutex>> mutexes_;
};

struct LockedCache {
  KVCache cache;
  SequenceLocks locks;
};

std::unique_ptr<LockedCache> make_cache(std::int64_t kv_heads, std::int64_t d,
                                        std::optional<std::int64_t> dv, const std::string& storage,
                                        std::int64_t page_rows, std::int64_t max_pages,
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
  return std::make_unique<LockedCache>(KVCache(options));
}

void append(LockedCache& c, SequenceId sequence, const py::handle& k_in, const py::handle& v_in) {
  ArrayKeeper keeper;
  const TensorView k = view_of(k_in, "k", keeper);
  const TensorView v = view_of(v_in, "v", keeper);
  py::gil_scoped_release appending;
  const auto held = c.locks.lock({sequence});
  c.cache.append(sequence, k, v);
}

// A call on one sequence's rows under its lock, with the GIL released.
template <typename Call>
auto on_sequence(LockedCache& c, SequenceId sequence, Call call) {
  py::gil_scoped_release working;
  const auto held = c.locks.lock({sequence});
  return call(c.cache);
}

py::tuple attention_cached_call(const py::handle& q_in, LockedCache& c,
                                const std::vector<SequenceId>& sequences,
                                const py::dict& option_items) {
  ArrayKeeper keeper;
  const TensorView q = view_of(q_in, "q", keeper);
  AttentionOptions options = attention_options(option_items, keeper);
  if (!has_item(option_items, "out_dtype")) {
    // The inputs' rule, but a cached call gives no float16 output: float32 then.
    options.out_dtype = default_out_dtype({&q}) == DType::kF64 ? DType::kF64 : DType::kF32;
  }
  AttentionResult result;
  {
    py::gil_scoped_release computing;
    const auto held = c.locks.lock(sequences);
    result = attention_cached(q, c.cache, sequences, options);
  }
  py::object lse = options.return_lse ? py::object(to_numpy(std::move(result.lse))) : py::none();
  return py::make_tuple(to_numpy(std::move(result.out)), lse, result.kernel);
}

}  // namespace

void register_kv_cache(py::module_& m) {
  py::class_<LockedCache>(m, "KVCache", "See qkv.KVCache.")
      .def(py::init(&make_cache), py::arg("kv_heads"), py::arg("d"), py::arg("dv"),
           py::arg("storage"), py::arg("page_rows"), py::arg("max_pages"), py::arg("max_bytes"))
      .def("add_sequence", [](LockedCache& c) { return c.cache.add_sequence(); })
      .def(
          "fork",
          [](LockedCache& c, SequenceId parent) {
            return on_sequence(c, parent, [&](KVCache& cache) { return cache.fork(parent); });
          },
          py::arg("sequence"))
      .def(
          "remove",
          [](LockedCache& c, SequenceId sequence) {
            on_sequence(c, sequence, [&](KVCache& cache) { cache.remove(sequence); });
            c.locks.forget(sequence);
          },
          py::arg("sequence"))
      .def(
          "contains", [](const LockedCache& c, SequenceId s) { return c.cache.contains(s); },
          py::arg("sequence"))
      .def("sequences", [](const LockedCache& c) { return c.cache.sequences(); })
      .def("append", &append, py::arg("sequence"), py::arg("k"), py::arg("v"))
      .def(
          "forget_before",
          [](LockedCache& c, SequenceId sequence, std::int64_t row) {
            on_sequence(c, sequence, [&](KVCache& cache) { cache.forget_before(sequence, row); });
          },
          py::arg("sequence"), py::arg("row"))
      .def(
          "length", [](const LockedCache& c, SequenceId s) { return c.cache.length(s); },
          py::arg("sequence"))
      .def(
          "first_stored_row",
          [](const LockedCache& c, SequenceId s) { return c.cache.first_stored_row(s); },
          py::arg("sequence"))
      .def("pages_in_use", [](const LockedCache& c) { return c.cache.pages_in_use(); })
      .def("page_bytes", [](const LockedCache& c) { return c.cache.page_bytes(); })
      .def("bytes_in_use", [](const LockedCache& c) { return c.cache.bytes_in_use(); })
      .def("storage",
           [](const LockedCache& c) { return cache_storage_name(c.cache.options().storage); })
      .def("shape",
           [](const LockedCache& c) {
             const KVCacheOptions& o = c.cache.options();
             return py::make_tuple(o.kv_heads, o.d, o.dv);
           })
      .def(
          "gather",
          [](LockedCache& c, SequenceId sequence, bool values) {
            Tensor rows = on_sequence(
                c, sequence, [&](KVCache& cache) { return cache.gather(sequence, values); });
            return to_numpy(std::move(rows));
          },
          py::arg("sequence"), py::arg("values"));
  m.def("attention_cached", &attention_cached_call, "See qkv.attention_cached.");
}

}  // namespace qkv::python
