#include "kernels/kernel.h"

namespace qkv::kernels {

std::span<const AttentionKernel> attention_kernels() {
  static const AttentionKernel kKernels[] = {
      {"reference", "float64 row-by-row statement of the formulas; supports every call",
       attention_fwd_reference_declines, attention_fwd_reference},
  };
  return kKernels;
}

}  // namespace qkv::kernels
