// The packed-operand policy of the fused driver (fused_driver-inl.h): the element type its Q,
// K^T and V tiles hold, how many of them a tile takes, and how operands are packed into them.
// RealTiles<E> holds plain rows of E: F32Tiles, the layout every float32 micro-kernel but the
// bf16 one reads, and F64Tiles, the float64 path's; Bf16Tiles (in fused_bf16-inl.h, AVX-512
// only) packs bf16 pairs for vdpbf16ps.
#pragma once

#include <cstdint>

#include "kernels/fused_common.h"

namespace qkv::kernels::fused {

template <class E>
struct RealTiles {
  using T = E;
  // Q and V stored as E (kInPlaceDType) with dense rows may be read in place (see the driver).
  static constexpr bool kReadsInPlace = true;
  static constexpr DType kInPlaceDType = kDTypeOf<E>;
  // pack_v leaves V's padding as make() left it: a packed V needs zeroed slots.
  static constexpr bool kWritesPadding = false;
  // Elements of one Q row in the packed tile, and of one [d x kKeyTile] K^T tile.
  static std::int64_t q_row(std::int64_t d) noexcept { return d; }
  static std::int64_t kt_tile(std::int64_t d) noexcept { return d * kKeyTile; }

  static BufferOf<T> make(std::int64_t elements, bool zeroed = true) noexcept {
    return make_buffer<T>(elements, zeroed);
  }
  static T* data(const BufferOf<T>& b) noexcept { return b.get(); }

  // Q rows [row0, row0 + rows) of head h: dst[r * q_row(cols) + c].
  // `round_to`: the call's storage type (AttentionParams::compute), which operands wider than
  // it are rounded to while packed.
  static void pack_q(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                     std::int64_t row0, std::int64_t rows, std::int64_t cols, T* dst,
                     DType round_to) noexcept {
    pack_rows(op, b, h, row0, rows, cols, dst, cols, round_to);
  }
  // Keys [row0, row0 + rows) of one K^T tile, the tile already zeroed when rows < kKeyTile.
  static void pack_kt(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                      std::int64_t row0, std::int64_t rows, std::int64_t cols, T* dst,
                      DType round_to) noexcept {
    pack_transposed(op, b, h, row0, rows, cols, dst, kKeyTile, round_to);
  }
  // V rows [row0, row0 + rows) at dst, rows ldv apart (a tile of kKeyTile keys: kKeyTile · ldv
  // elements); the padding stays as make() left it (zeros).
  static void pack_v(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                     std::int64_t row0, std::int64_t rows, std::int64_t cols, T* dst,
                     std::int64_t ldv, DType round_to) noexcept {
    pack_rows(op, b, h, row0, rows, cols, dst, ldv, round_to);
  }
};

using F32Tiles = RealTiles<float>;
using F64Tiles = RealTiles<double>;

}  // namespace qkv::kernels::fused
