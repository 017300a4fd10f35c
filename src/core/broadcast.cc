#include "core/broadcast.h"

#include "qkv/error.h"

namespace qkv::core {

Shape broadcast_strides(const TensorView& view, const Shape& target,
                        const std::string& target_description) {
  const auto fail = [&] {
    return Error(view.name, "shape " + shape_string(view.shape) + " does not broadcast to " +
                                target_description);
  };
  const std::size_t rank = view.shape.size();
  const std::size_t target_rank = target.size();
  if (rank > target_rank) {
    throw Error(view.name,
                "shape " + shape_string(view.shape) + " has " + std::to_string(rank) +
                    " dims, more than the " + std::to_string(target_rank) + " of " +
                    target_description +
                    " (NumPy's broadcasting rule: a mask may have fewer dims, not more)");
  }
  Shape strides(target_rank, 0);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::size_t axis = rank - 1 - i;  // counted from the right
    const std::int64_t extent = view.shape[axis];
    const std::size_t target_axis = target_rank - 1 - i;
    if (extent == target[target_axis]) {
      strides[target_axis] = extent == 1 ? 0 : view.strides[axis];
    } else if (extent != 1) {
      throw fail();
    }
  }
  return strides;
}

}  // namespace qkv::core
