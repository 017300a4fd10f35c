// Timing calls in C++, without Python in the loop (qkv.bench, bench/python_overhead.py).
//
// _qkv.time_attention reads its inputs as _qkv.attention does (the same views of the same
// arrays), then calls qkv::attention `warmup + repeats` times in a C++ loop with the GIL
// released, timing each call with std::chrono::steady_clock. Each call allocates and frees its
// output as a call from Python does; only the Python layer (argument conversion, the NumPy array
// around the output) is left out, which is what bench/python_overhead.py compares against.
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "options.h"
#include "qkv/attention.h"

namespace qkv::python {

namespace {

int checked_count(std::int64_t value, std::int64_t least, const std::string& subject,
                  const std::string& meaning) {
  if (value < least || value > std::numeric_limits<int>::max()) {
    throw Error(subject, "must be " + meaning + ", got " + std::to_string(value));
  }
  return static_cast<int>(value);
}

// Returns (seconds of each timed call, the kernel that ran).
std::pair<std::vector<double>, std::string> time_attention(
    const py::handle& q_in, const py::handle& k_in, const py::handle& v_in,
    const py::dict& option_items, std::int64_t repeats, std::int64_t warmup) {
  ArrayKeeper keeper;
  const AttentionCallInputs call = attention_call_inputs(q_in, k_in, v_in, option_items, keeper);
  const auto& [q, k, v, options] = call;
  const int timed = checked_count(repeats, 1, "repeats", "1 or more");
  const int untimed = checked_count(warmup, 0, "warmup", "0 or more");

  std::vector<double> seconds;
  seconds.reserve(static_cast<std::size_t>(timed));
  std::string ran;
  {
    py::gil_scoped_release computing;
    for (int i = 0; i < untimed; ++i) ran = qkv::attention(q, k, v, options).kernel;
    for (int i = 0; i < timed; ++i) {
      const auto start = std::chrono::steady_clock::now();
      {
        // Freed inside the timed span, as a Python caller's previous output is when it
        // rebinds the name to the next one.
        AttentionResult result = qkv::attention(q, k, v, options);
        if (i == 0) ran = std::move(result.kernel);
      }
      const auto stop = std::chrono::steady_clock::now();
      seconds.push_back(std::chrono::duration<double>(stop - start).count());
    }
  }
  return {std::move(seconds), std::move(ran)};
}

}  // namespace

void register_timing(py::module_& m) {
  m.def("time_attention", &time_attention, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("options"), py::arg("repeats") = 10, py::arg("warmup") = 1,
        "Runs qkv::attention warmup + repeats times in a C++ loop with the GIL released; "
        "returns (the seconds of each of the `repeats` timed calls, the kernel that ran). "
        "q, k, v are NumPy arrays (or the ('bfloat16', uint16 bits) pair); options is the "
        "dict qkv._options.attention_options makes, as for _qkv.attention.");
}

}  // namespace qkv::python
