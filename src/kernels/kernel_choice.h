// The one rule the forward and backward entry points choose a kernel by: a forced kernel
// (options.kernel) must exist and support the call; otherwise the first in list order that
// supports it and does not pass it over (a kernel without `passes` suits every call it
// supports); the list's last entry, the reference, supports every call.
#pragma once

#include <span>
#include <string>

#include "qkv/error.h"

namespace qkv::kernels {

template <class Kernel, class Params>
bool kernel_passes(const Kernel& kernel, const Params& params) {
  if constexpr (requires { kernel.passes; }) {
    return kernel.passes != nullptr && !kernel.passes(params).empty();
  } else {
    return false;
  }
}

// `what` names the list in the error for an unknown name ("kernel", "backward kernel").
template <class Kernel, class Params>
const Kernel& choose_from(std::span<const Kernel> list, const Params& params,
                          const std::string& requested, const std::string& what) {
  if (!requested.empty()) {
    for (const auto& kernel : list) {
      if (kernel.name != requested) continue;
      const std::string reason = kernel.declines(params);
      if (!reason.empty()) throw Error("kernel " + requested, "cannot run this call: " + reason);
      return kernel;
    }
    std::string names;
    for (const auto& kernel : list) names += (names.empty() ? "" : ", ") + std::string(kernel.name);
    throw Error("kernel " + requested, "no such " + what + " (available: " + names + ")");
  }
  for (const auto& kernel : list) {
    if (kernel.declines(params).empty() && !kernel_passes(kernel, params)) return kernel;
  }
  return list.back();
}

}  // namespace qkv::kernels
