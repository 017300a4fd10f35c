// The kernel boundary: every attention kernel takes the same AttentionParams, can say why it
// declines a call, and never throws. The list runs fastest first, the reference last; the
// reference supports every call, so the default choice always finds one.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/params.h"

namespace qkv::kernels {

struct AttentionKernel {
  std::string_view name;
  std::string_view description;
  // Empty when the kernel supports these params, else the reason it declines.
  std::string (*declines)(const core::AttentionParams& params);
  void (*run)(const core::AttentionParams& params) noexcept;
};

std::span<const AttentionKernel> attention_kernels();

// The kernels, each declared beside its twin; all share AttentionKernel's signature.
std::string attention_fwd_reference_declines(const core::AttentionParams& params);
void attention_fwd_reference(const core::AttentionParams& params) noexcept;

}  // namespace qkv::kernels
