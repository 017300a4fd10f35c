// The allowed(i, j) rule and mask values of one explained batch element, kept beside the
// explanation so that any (head, i, j) can be asked for later without the caller's tensors.
#pragma once

#include <cstdint>
#include <memory>

#include "core/params.h"
#include "qkv/explain.h"
#include "qkv/tensor.h"

namespace qkv::explain_detail {

struct MaskRule {
  // Points into `mask` (a copy the rules of every explained batch element share) when there is
  // a mask.
  core::Masking masking;
  std::shared_ptr<const Tensor> mask;
  std::int64_t batch = 0;
  std::int64_t nq = 0, nk = 0;
};

}  // namespace qkv::explain_detail
