// AMX tiles for the bf16 products (amx_tiles.h). Compiled with target attributes rather than
// through Highway, which has no tile instructions; GCC on x86-64 only (as the vdpbf16ps paths:
// attention_fwd_fused_hwy.cc says why clang is left out), and not in a portable build (no
// SIMD). Elsewhere amx_bf16_supported() is false and nothing calls the tiles.
//
// amx_gemm_bf16 keeps a 32 x 32 block of C in four tiles (tmm0-3) and streams the reduction in
// steps of 16 pairs: two A tiles (tmm4-5: 16 rows x 16 pairs) and two B tiles (tmm6-7: 16
// pairs x 16 columns), four tdpbf16ps a step (16·16·32·2 flops each), row blocks outside and
// column blocks inside. Blocks at the edges use one row or one column of tiles; the last rows
// when m is not a multiple of 16 go through a 16-row scratch block, so C is written for rows
// [0, m) only.
#include "kernels/amx_tiles.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "core/half.h"

#if defined(__x86_64__) && !defined(__clang__) && defined(QKV_HAVE_HWY)
#define QKV_AMX_TILES 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define QKV_AMX_TILES 0
#endif

namespace qkv::kernels {

namespace {

// The two bf16 values of a pair word, low half first.
float bf16_low(std::uint32_t word) noexcept {
  return core::bf16_to_float(static_cast<std::uint16_t>(word));
}
float bf16_high(std::uint32_t word) noexcept {
  return core::bf16_to_float(static_cast<std::uint16_t>(word >> 16));
}

}  // namespace

void amx_gemm_bf16_reference(std::int64_t m, std::int64_t n, std::int64_t k2,
                             const std::uint32_t* a, std::int64_t lda, const std::uint32_t* b,
                             std::int64_t ldb, float* c, std::int64_t ldc,
                             bool accumulate) noexcept {
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t col = 0; col < n; ++col) {
      float sum = accumulate ? c[r * ldc + col] : 0.0f;
      for (std::int64_t x = 0; x < k2; ++x) {
        const std::uint32_t aw = a[r * lda + x];
        const std::uint32_t bw = b[x * ldb + col];
        sum += bf16_low(aw) * bf16_low(bw) + bf16_high(aw) * bf16_high(bw);
      }
      c[r * ldc + col] = sum;
    }
  }
}

#if QKV_AMX_TILES

namespace {

// The tile configuration of palette 1 (Intel SDM, LDTILECFG): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

constexpr std::int64_t kTile = kAmxTile;

void fill_rows(std::int64_t m, std::int64_t n, float* c, std::int64_t ldc, float value) {
  for (std::int64_t r = 0; r < m; ++r) std::fill_n(c + r * ldc, n, value);
}

// The C block of R x C tiles at c (ld `ldc` floats) (+)= A·B over k2 pairs.
template <int R, int C>
__attribute__((target("amx-tile,amx-bf16"))) inline void block(
    std::int64_t k2, const std::uint32_t* a, std::int64_t lda, const std::uint32_t* b,
    std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) noexcept {
  const auto cs = static_cast<long>(ldc * 4);
  const auto as = static_cast<long>(lda * 4);
  const auto bs = static_cast<long>(ldb * 4);
  float* c10 = c + kTile * ldc;
  // GCC 12's tile loads are asm statements that do not say they read memory: without this
  // barrier the stores that filled the operands (the scratch block below) could move past them.
  asm volatile("" : : : "memory");
  if (accumulate) {
    _tile_loadd(0, c, cs);
    if constexpr (C == 2) _tile_loadd(1, c + kTile, cs);
    if constexpr (R == 2) _tile_loadd(2, c10, cs);
    if constexpr (R == 2 && C == 2) _tile_loadd(3, c10 + kTile, cs);
  } else {
    _tile_zero(0);
    if constexpr (C == 2) _tile_zero(1);
    if constexpr (R == 2) _tile_zero(2);
    if constexpr (R == 2 && C == 2) _tile_zero(3);
  }
  for (std::int64_t x = 0; x < k2; x += kTile) {
    _tile_loadd(4, a + x, as);
    _tile_loadd(6, b + x * ldb, bs);
    if constexpr (C == 2) _tile_loadd(7, b + x * ldb + kTile, bs);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (C == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (R == 2) {
      _tile_loadd(5, a + kTile * lda + x, as);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (C == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, cs);
  if constexpr (C == 2) _tile_stored(1, c + kTile, cs);
  if constexpr (R == 2) _tile_stored(2, c10, cs);
  if constexpr (R == 2 && C == 2) _tile_stored(3, c10 + kTile, cs);
}

bool request_tile_state() noexcept {
  // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux 5.16 and later hand the tile
  // state (8 KiB a thread) only to a process that asks for it.
  constexpr long kRequestPermission = 0x1023;
  constexpr long kTileData = 18;
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

constexpr TileConfig sixteen_rows_of_64_bytes() noexcept {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = kTile;
  }
  return config;
}

// A static object, not a local: GCC 12's _tile_loadconfig does not tell the compiler that it
// reads the memory, and a local configuration's stores were dropped as dead (the tiles then
// stayed unconfigured and the first tile load faulted).
constexpr TileConfig kTileConfig = sixteen_rows_of_64_bytes();

__attribute__((target("amx-tile"))) void load_tile_config() noexcept {
  _tile_loadconfig(&kTileConfig);
}

__attribute__((target("amx-tile"))) void release_tiles() noexcept { _tile_release(); }

}  // namespace

bool cpu_has_amx_bf16() noexcept {
  static const bool has =
      __builtin_cpu_supports("amx-tile") != 0 && __builtin_cpu_supports("amx-bf16") != 0;
  return has;
}

bool amx_bf16_supported() noexcept {
  static const bool chosen = [] {
    if (const char* choice = std::getenv("QKV_BF16_AMX");
        choice != nullptr && std::strcmp(choice, "0") == 0) {
      return false;
    }
    return cpu_has_amx_bf16() && request_tile_state();
  }();
  return chosen;
}

AmxTileSession::AmxTileSession() noexcept { load_tile_config(); }

AmxTileSession::~AmxTileSession() { release_tiles(); }

void amx_gemm_bf16(std::int64_t m, std::int64_t n, std::int64_t k2, const std::uint32_t* a,
                   std::int64_t lda, const std::uint32_t* b, std::int64_t ldb, float* c,
                   std::int64_t ldc, bool accumulate) noexcept {
  if (m <= 0 || n <= 0) return;
  if (k2 == 0) {  // an empty sum: A and B may be empty buffers
    if (!accumulate) fill_rows(m, n, c, ldc, 0.0f);
    return;
  }
  const std::int64_t whole = m / kTile * kTile;
  // Row blocks outside, column blocks inside: a row block's C rows are written (and, adding,
  // read) together, and B (at most k2 x n words: 16 KiB in the backward's products) stays in
  // L1 from one row block to the next. The other order, columns outside, wrote C in 128-byte
  // pieces spread over all of it: a standalone loop of 128 x 128 products (32 to 512 pairs,
  // adding or not) ran 0.42-0.99x as fast that way, in two runs on a noisy host.
  const auto row_block = [&]<int R>(std::int64_t r) {
    for (std::int64_t col = 0; col < n; col += 2 * kTile) {
      float* cc = c + r * ldc + col;
      if (col + 2 * kTile <= n) {
        block<R, 2>(k2, a + r * lda, lda, b + col, ldb, cc, ldc, accumulate);
      } else {
        block<R, 1>(k2, a + r * lda, lda, b + col, ldb, cc, ldc, accumulate);
      }
    }
  };
  std::int64_t r = 0;
  for (; r + 2 * kTile <= whole; r += 2 * kTile) row_block.template operator()<2>(r);
  for (; r < whole; r += kTile) row_block.template operator()<1>(r);
  if (r == m) return;
  // The last m - r rows: through a 16-row scratch block, 32 columns at a time.
  const std::int64_t rows = m - r;
  alignas(64) float scratch[kTile * 2 * kTile];
  for (std::int64_t col = 0; col < n; col += 2 * kTile) {
    const bool two = col + 2 * kTile <= n;
    const std::int64_t cols = two ? 2 * kTile : kTile;
    float* cc = c + r * ldc + col;
    std::fill(std::begin(scratch), std::end(scratch), 0.0f);
    if (accumulate) {
      for (std::int64_t i = 0; i < rows; ++i) std::copy_n(cc + i * ldc, cols, scratch + i * 2 * kTile);
    }
    if (two) {
      block<1, 2>(k2, a + r * lda, lda, b + col, ldb, scratch, 2 * kTile, accumulate);
    } else {
      block<1, 1>(k2, a + r * lda, lda, b + col, ldb, scratch, 2 * kTile, accumulate);
    }
    for (std::int64_t i = 0; i < rows; ++i) std::copy_n(scratch + i * 2 * kTile, cols, cc + i * ldc);
  }
}

#else

bool cpu_has_amx_bf16() noexcept { return false; }
bool amx_bf16_supported() noexcept { return false; }
AmxTileSession::AmxTileSession() noexcept = default;
AmxTileSession::~AmxTileSession() = default;

void amx_gemm_bf16(std::int64_t m, std::int64_t n, std::int64_t k2, const std::uint32_t* a,
                   std::int64_t lda, const std::uint32_t* b, std::int64_t ldb, float* c,
                   std::int64_t ldc, bool accumulate) noexcept {
  amx_gemm_bf16_reference(m, n, k2, a, lda, b, ldb, c, ldc, accumulate);
}

#endif

}  // namespace qkv::kernels
