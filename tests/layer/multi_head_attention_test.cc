// The layer against the composition of its pieces: linear(), attention() per head on copied
// column blocks, concatenation, and the output projection; with dropout, attention() on the
// heads [B, H, N, dk] with the same seed and offset.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <thread>

#include "core/parallel_for.h"
#include "qkv/error.h"
#include "qkv/layer.h"
#include "support/test_support.h"

// OpenBLAS's, when the CBLAS is OpenBLAS.
extern "C" void openblas_set_num_threads(int num_threads) __attribute__((weak));
extern "C" int openblas_get_num_threads(void) __attribute__((weak));

namespace qkv {
namespace {

Tensor rnd(Shape shape, std::uint64_t seed, const char* name, DType dtype = DType::kF64) {
  Tensor r = testing::random_tensor(dtype, shape, seed);
  Tensor t(dtype, shape, name);
  std::memcpy(t.data(), r.data(), r.nbytes());
  return t;
}

// Columns [first, first + width) of a 2-D tensor, copied.
Tensor columns(const Tensor& m, std::int64_t first, std::int64_t width) {
  const std::int64_t cols = m.shape()[1];
  const TensorView block{static_cast<const double*>(m.data()) + first,
                         DType::kF64,
                         {m.shape()[0], width},
                         {cols, 1},
                         "block"};
  return contiguous_copy(block, DType::kF64);
}

// The layer for one 2-D sample matrix, composed from public pieces in float64.
Tensor composed_layer(const Tensor& x, const Tensor& memory, const LayerWeights& w,
                      std::int64_t heads, std::int64_t kv_heads, const AttentionOptions& o) {
  const std::int64_t dk = w.wq.shape[1] / heads;
  const std::int64_t dv = w.wv.shape[1] / kv_heads;
  const Tensor q = linear(x.view(), w.wq, w.bq).to(DType::kF64);
  const Tensor k = linear(memory.view(), w.wk, w.bk).to(DType::kF64);
  const Tensor v = linear(memory.view(), w.wv, w.bv).to(DType::kF64);
  Tensor concat(DType::kF64, {x.shape()[0], heads * dv}, "concat");
  AttentionOptions per_head = o;
  per_head.kernel = "reference";
  per_head.out_dtype = DType::kF64;
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t hk = h / (heads / kv_heads);
    const Tensor qh = columns(q, h * dk, dk);
    const Tensor kh = columns(k, hk * dk, dk);
    const Tensor vh = columns(v, hk * dv, dv);
    const AttentionResult r = attention(qh.view(), kh.view(), vh.view(), per_head);
    for (std::int64_t i = 0; i < x.shape()[0]; ++i) {
      for (std::int64_t c = 0; c < dv; ++c) {
        concat.data_as<double>()[i * heads * dv + h * dv + c] = r.out.data_as<double>()[i * dv + c];
      }
    }
  }
  return w.wo ? linear(concat.view(), *w.wo, w.bo).to(DType::kF64) : std::move(concat);
}

TEST(MultiHeadAttention, EqualsTheCompositionOfItsPieces) {
  const Tensor x = rnd({7, 16}, 1, "x.npy");
  const Tensor wq = rnd({16, 4 * 3}, 2, "wq.npy");
  const Tensor wk = rnd({16, 2 * 3}, 3, "wk.npy");
  const Tensor wv = rnd({16, 2 * 5}, 4, "wv.npy");
  const Tensor wo = rnd({4 * 5, 6}, 5, "wo.npy");
  const Tensor bq = rnd({12}, 6, "bq.npy");
  const Tensor bk = rnd({6}, 7, "bk.npy");
  const Tensor bv = rnd({10}, 8, "bv.npy");
  const Tensor bo = rnd({6}, 9, "bo.npy");
  const LayerWeights w{wq.view(), wk.view(), wv.view(), wo.view(),
                       bq.view(), bk.view(), bv.view(), bo.view()};
  LayerOptions o;
  o.heads = 4;
  o.kv_heads = 2;
  o.attention.causal = true;
  o.attention.out_dtype = DType::kF64;
  o.attention.kernel = "reference";
  const LayerResult r = multi_head_attention(x.view(), w, o);
  EXPECT_EQ(r.out.shape(), (Shape{7, 6}));
  const Tensor expected = composed_layer(x, x, w, 4, 2, o.attention);
  EXPECT_LT(testing::max_abs_diff(r.out.view(), expected.view()), 1e-12);
}

TEST(MultiHeadAttention, BatchedCrossAttentionWithMaskAndWeights) {
  const Tensor x = rnd({2, 5, 8}, 10, "x.npy");
  const Tensor m = rnd({2, 9, 6}, 11, "memory.npy");
  const Tensor wq = rnd({8, 2 * 4}, 12, "wq.npy");
  const Tensor wk = rnd({6, 2 * 4}, 13, "wk.npy");
  const Tensor wv = rnd({6, 2 * 3}, 14, "wv.npy");
  Tensor padding(DType::kBool, {2, 1, 1, 9}, "mask.npy");
  for (int j = 0; j < 18; ++j) padding.data_as<bool>()[j] = (j % 9) < (j < 9 ? 9 : 4);
  const LayerWeights w{wq.view(), wk.view(), wv.view()};
  LayerOptions o;
  o.heads = 2;
  o.attention.mask = padding.view();
  o.attention.return_weights = true;
  o.attention.out_dtype = DType::kF64;
  o.attention.kernel = "reference";  // the composition is under test here, not the kernel
  const LayerResult r = multi_head_attention(x.view(), w, o, m.view());
  EXPECT_EQ(r.out.shape(), (Shape{2, 5, 6}));
  EXPECT_EQ(r.weights.shape(), (Shape{2, 2, 5, 9}));
  for (std::int64_t b = 0; b < 2; ++b) {
    Tensor xb(DType::kF64, {5, 8}, "xb"), mb(DType::kF64, {9, 6}, "mb");
    std::memcpy(xb.data(), x.data_as<double>() + b * 40, xb.nbytes());
    std::memcpy(mb.data(), m.data_as<double>() + b * 54, mb.nbytes());
    AttentionOptions per_batch;
    const TensorView mask_b{padding.data_as<bool>() + b * 9, DType::kBool, {9}, {1}, "mask"};
    per_batch.mask = mask_b;
    const Tensor expected = composed_layer(xb, mb, w, 2, 2, per_batch);
    const TensorView out_b{r.out.data_as<double>() + b * 30, DType::kF64, {5, 6}, {6, 1}, "ob"};
    EXPECT_LT(testing::max_abs_diff(out_b, expected.view()), 1e-12) << "batch " << b;
  }
  // Batch 1 pads keys 4..8: their weights are exactly zero.
  for (std::int64_t e = 0; e < 2 * 5 * 9; ++e) {
    if (e % 9 >= 4) {
      EXPECT_EQ(r.weights.data_as<double>()[2 * 5 * 9 + e], 0.0);
    }
  }
}

TEST(MultiHeadAttention, Float32PathMatchesFloat64WithinFloat32Accuracy) {
  const Tensor x = rnd({9, 12}, 20, "x", DType::kF32);
  const Tensor wq = rnd({12, 12}, 21, "wq", DType::kF32);
  const Tensor wk = rnd({12, 12}, 22, "wk", DType::kF32);
  const Tensor wv = rnd({12, 12}, 23, "wv", DType::kF32);
  const LayerWeights w{wq.view(), wk.view(), wv.view()};
  LayerOptions o;
  o.heads = 3;
  const LayerResult single = multi_head_attention(x.view(), w, o);
  EXPECT_EQ(single.out.dtype(), DType::kF32);
  o.attention.out_dtype = DType::kF64;
  const LayerResult dbl = multi_head_attention(x.view(), w, o);
  EXPECT_LT(testing::max_abs_diff(single.out.view(), dbl.out.view()), 2e-6);
}

// 16-bit X and weights (as safetensors checkpoints hold them) are widened exactly into the
// float32 compute path: the same result as the same values given in float32, bit for bit. A
// bool input is still refused by name.
TEST(MultiHeadAttention, SixteenBitInputsComputeInFloat32) {
  const Tensor x = rnd({9, 12}, 30, "x", DType::kF16);
  const Tensor wq = rnd({12, 12}, 31, "wq", DType::kBF16);
  const Tensor wk = rnd({12, 12}, 32, "wk", DType::kF16);
  const Tensor wv = rnd({12, 12}, 33, "wv", DType::kF32);
  const Tensor bq = rnd({12}, 34, "bq", DType::kBF16);
  LayerWeights w16{wq.view(), wk.view(), wv.view()};
  w16.bq = bq.view();
  const Tensor wq32 = wq.to(DType::kF32), wk32 = wk.to(DType::kF32), bq32 = bq.to(DType::kF32);
  LayerWeights w32{wq32.view(), wk32.view(), wv.view()};
  w32.bq = bq32.view();
  LayerOptions o;
  o.heads = 3;
  o.attention.causal = true;
  const LayerResult got = multi_head_attention(x.view(), w16, o);
  const LayerResult expected = multi_head_attention(x.to(DType::kF32).view(), w32, o);
  EXPECT_EQ(got.out.dtype(), DType::kF32);
  EXPECT_EQ(testing::max_abs_diff(got.out.view(), expected.out.view()), 0.0);
  const Tensor y16 = linear(x.view(), wk.view(), std::nullopt);
  const Tensor y32 = linear(x.to(DType::kF32).view(), wk32.view(), std::nullopt);
  EXPECT_EQ(y16.dtype(), DType::kF32);
  EXPECT_EQ(testing::max_abs_diff(y16.view(), y32.view()), 0.0);

  const Tensor flags = rnd({9, 12}, 35, "flags.npy", DType::kBool);
  try {
    multi_head_attention(flags.view(), w16, o);
    ADD_FAILURE() << "a bool input was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "flags.npy");
    EXPECT_NE(e.problem().find("dtype bool is not supported"), std::string::npos) << e.what();
  }
}

// A float16 output (out, weights, lse) is the float32 layer's, rounded once; the layer does
// not fall back to float64 for it. The storage dtype and the score modifiers reach the heads:
// the layer equals attention() on the projected Q, K, V with the same options.
TEST(MultiHeadAttention, Float16OutputsAndV2OptionsReachTheHeads) {
  const Tensor x = rnd({9, 12}, 40, "x", DType::kF32);
  const Tensor wq = rnd({12, 12}, 41, "wq", DType::kF32);
  const Tensor wk = rnd({12, 6}, 42, "wk", DType::kF32);
  const Tensor wv = rnd({12, 6}, 43, "wv", DType::kF32);
  const Tensor sinks = rnd({2}, 44, "sinks", DType::kF32);
  const LayerWeights w{wq.view(), wk.view(), wv.view()};
  LayerOptions o;
  o.heads = 2;
  o.kv_heads = 1;
  o.attention.causal = true;
  o.attention.softcap = 2.0;
  o.attention.alibi = true;
  o.attention.sinks = sinks.view();
  o.attention.dtype = DType::kBF16;
  o.attention.return_weights = true;
  o.attention.return_lse = true;
  const LayerResult f32 = multi_head_attention(x.view(), w, o);
  o.attention.out_dtype = DType::kF16;
  const LayerResult f16 = multi_head_attention(x.view(), w, o);
  for (const auto& [got, want] :
       {std::pair{&f16.out, &f32.out}, std::pair{&f16.weights, &f32.weights},
        std::pair{&f16.lse, &f32.lse}}) {
    ASSERT_EQ(got->dtype(), DType::kF16);
    EXPECT_EQ(testing::max_abs_diff(got->view(), want->to(DType::kF16).view()), 0.0);
  }
  // The heads themselves: attention() on Q = X·WQ, K = X·WK, V = X·WV as [H, N, dk] views.
  const Tensor q = linear(x.view(), wq.view(), std::nullopt);
  const Tensor k = linear(x.view(), wk.view(), std::nullopt);
  const Tensor v = linear(x.view(), wv.view(), std::nullopt);
  const TensorView qh{q.data(), DType::kF32, {2, 9, 6}, {6, 12, 1}, "q"};
  const TensorView kh{k.data(), DType::kF32, {1, 9, 6}, {6, 6, 1}, "k"};
  const TensorView vh{v.data(), DType::kF32, {1, 9, 6}, {6, 6, 1}, "v"};
  AttentionOptions a = o.attention;
  a.out_dtype = DType::kF32;
  const AttentionResult heads = attention(qh, kh, vh, a);
  EXPECT_EQ(testing::max_abs_diff(heads.lse.view(), f32.lse.view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(heads.weights.view(), f32.weights.view()), 0.0);
}

// Rows [B, N, H·w] of a projection as contiguous heads [B, H, N, w] (copied: the composition
// below does not reuse the layer's strided views).
Tensor heads_of(const Tensor& rows, std::int64_t heads, std::int64_t w) {
  const std::int64_t b = rows.shape()[0], n = rows.shape()[1];
  const TensorView split{
      rows.data(), rows.dtype(), {b, heads, n, w}, {n * heads * w, w, heads * w, 1}, "heads"};
  return contiguous_copy(split, rows.dtype());
}

// Heads [B, H, N, w] back as the rows [B, N, H·w] of their concatenation.
Tensor concat_of(const Tensor& heads) {
  const std::int64_t b = heads.shape()[0], h = heads.shape()[1], n = heads.shape()[2],
                     w = heads.shape()[3];
  const TensorView rows{heads.data(), heads.dtype(), {b, n, h, w}, {h * n * w, w, n * w, 1},
                        "concat"};
  Tensor concat = contiguous_copy(rows, heads.dtype());
  concat.reshape({b, n, h * w});
  return concat;
}

struct DropoutLayer {
  Tensor x = rnd({2, 37, 16}, 50, "x", DType::kF32);
  Tensor wq = rnd({16, 4 * 6}, 51, "wq", DType::kF32);
  Tensor wk = rnd({16, 2 * 6}, 52, "wk", DType::kF32);
  Tensor wv = rnd({16, 2 * 5}, 53, "wv", DType::kF32);
  Tensor wo = rnd({4 * 5, 7}, 54, "wo", DType::kF32);
  Tensor bq = rnd({24}, 55, "bq", DType::kF32);
  Tensor bv = rnd({10}, 56, "bv", DType::kF32);
  Tensor bo = rnd({7}, 57, "bo", DType::kF32);
  LayerWeights weights() const {
    LayerWeights w{wq.view(), wk.view(), wv.view(), wo.view()};
    w.bq = bq.view();
    w.bv = bv.view();
    w.bo = bo.view();
    return w;
  }
  LayerOptions options(int threads) const {
    LayerOptions o;
    o.heads = 4;
    o.kv_heads = 2;
    o.attention.causal = true;
    o.attention.return_weights = true;
    o.attention.return_lse = true;
    o.attention.threads = threads;
    o.attention.dropout_p = 0.3;
    o.attention.seed = 0xfeedface12345ull;
    o.attention.dropout_offset = 5;
    return o;
  }
};

// Head h of batch b draws the mask attention() draws for (b, h): the layer with dropout is,
// bit for bit, the projections (linear), attention() on the heads copied out as [B, H, N, dk]
// with the same seed and offset, and the output projection of their concatenation.
TEST(MultiHeadAttentionDropout, EqualsProjectionsThenAttentionWithTheSameSeedAndOffset) {
  const DropoutLayer in;
  const LayerOptions o = in.options(2);
  const LayerResult r = multi_head_attention(in.x.view(), in.weights(), o);
  const Tensor q = heads_of(linear(in.x.view(), in.wq.view(), in.bq.view(), 2), 4, 6);
  const Tensor k = heads_of(linear(in.x.view(), in.wk.view(), std::nullopt, 2), 2, 6);
  const Tensor v = heads_of(linear(in.x.view(), in.wv.view(), in.bv.view(), 2), 2, 5);
  const AttentionResult heads = attention(q.view(), k.view(), v.view(), o.attention);
  const Tensor out = linear(concat_of(heads.out).view(), in.wo.view(), in.bo.view(), 2);
  EXPECT_EQ(heads.kernel, r.kernel);
  EXPECT_TRUE(testing::same_bytes(heads.weights, r.weights));
  EXPECT_TRUE(testing::same_bytes(heads.lse, r.lse));
  EXPECT_TRUE(testing::same_bytes(out, r.out));
  // The same seed with another offset draws another mask.
  LayerOptions other = o;
  other.attention.dropout_offset = 6;
  const LayerResult shifted = multi_head_attention(in.x.view(), in.weights(), other);
  EXPECT_GT(testing::max_abs_diff(shifted.weights.view(), r.weights.view()), 0.1);

  // Against the layer without dropout: every allowed weight is dropped (0) or w / (1 - p), and
  // about 30% are dropped. (P is rounded to a multiple of 2^-16: 0.3 to 19661 / 65536.)
  LayerOptions none = o;
  none.attention.dropout_p = 0.0;
  const LayerResult plain = multi_head_attention(in.x.view(), in.weights(), none);
  EXPECT_TRUE(testing::same_bytes(plain.lse, r.lse));  // the softmax's, before dropout
  const double keep_scale = 65536.0 / (65536.0 - 19661.0);
  std::int64_t allowed = 0, dropped = 0;
  for (std::int64_t e = 0; e < r.weights.numel(); ++e) {
    const double w0 = plain.weights.data_as<float>()[e], w = r.weights.data_as<float>()[e];
    if (w0 == 0.0) continue;
    ++allowed;
    if (w == 0.0) {
      ++dropped;
    } else {
      EXPECT_NEAR(w, w0 * keep_scale, 1e-6 * w0 * keep_scale) << e;
    }
  }
  EXPECT_GT(allowed, 2000);
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(allowed), 0.3, 0.04);
}

// dropout_p = 0 is the layer without dropout, bit for bit (whatever the seed and offset), and
// the layer with dropout gives the same bits on 1, 2 and 3 threads.
TEST(MultiHeadAttentionDropout, ZeroIsNoDropoutAndTheBitsDoNotDependOnThreads) {
  const DropoutLayer in;
  LayerOptions zero = in.options(2);
  zero.attention.dropout_p = 0.0;
  LayerOptions plain = zero;
  plain.attention.seed = 0;
  plain.attention.dropout_offset = 0;
  const LayerResult a = multi_head_attention(in.x.view(), in.weights(), zero);
  const LayerResult b = multi_head_attention(in.x.view(), in.weights(), plain);
  EXPECT_TRUE(testing::same_bytes(a.out, b.out));
  EXPECT_TRUE(testing::same_bytes(a.weights, b.weights));
  const LayerResult one = multi_head_attention(in.x.view(), in.weights(), in.options(1));
  EXPECT_FALSE(testing::same_bytes(one.out, a.out));
  for (int threads : {2, 3}) {
    const LayerResult many = multi_head_attention(in.x.view(), in.weights(), in.options(threads));
    EXPECT_TRUE(testing::same_bytes(one.out, many.out)) << threads;
    EXPECT_TRUE(testing::same_bytes(one.weights, many.weights)) << threads;
  }
}

// A bad dropout_p (or softcap, ALiBi, sinks) is the attention's refusal, word for word, and
// comes before the memory budget's: the layer checks the heads' options before it projects.
TEST(MultiHeadAttentionDropout, ABadRateIsRefusedBeforeTheProjectionsAndTheBudget) {
  const DropoutLayer in;
  LayerOptions o = in.options(2);
  o.attention.dropout_p = 1.0;
  o.attention.max_memory = 1;  // the budget would refuse too, later
  try {
    multi_head_attention(in.x.view(), in.weights(), o);
    FAIL() << "dropout_p = 1 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "dropout_p: must be in [0, 1), got 1.000000");
  }
  o.attention.dropout_p = 0.3;
  o.attention.softcap = -1.0;
  try {
    multi_head_attention(in.x.view(), in.weights(), o);
    FAIL() << "softcap = -1 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "softcap");
  }
  o.attention.softcap.reset();
  EXPECT_THROW(
      {
        try {
          multi_head_attention(in.x.view(), in.weights(), o);
        } catch (const Error& e) {
          EXPECT_EQ(e.subject(), "max_memory");
          throw;
        }
      },
      Error);
}

// Threads of this process now (Linux: /proc/self/task).
int process_threads() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++count;
  }
  return count;
}

// CPU time of the whole process (every thread), in seconds.
double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

TEST(MultiHeadAttention, LeavesNoThreadBehindButItsParkedTeamNotEvenOpenBlasPool) {
  // The layer's projections (CBLAS) and both BLAS-free and BLAS kernels on 2 threads: when the
  // call returns, only this thread and qkv's own parked team (core/parallel_for.cc) are left.
  // OpenBLAS's pthread build keeps a pool of one thread per core that spins after each
  // threaded call (kernels/blas_threads.h), which would show here as one thread more on any
  // machine with more than one core.
  // OpenBLAS at one thread, as a program that wants no BLAS pool sets it (the qkv executable
  // does, before OpenBLAS loads): qkv then joins the pool that is left and starts none.
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);
  const Tensor x = rnd({600, 32}, 30, "x", DType::kF32);
  const Tensor wq = rnd({32, 32}, 31, "wq", DType::kF32);
  const Tensor wk = rnd({32, 32}, 32, "wk", DType::kF32);
  const Tensor wv = rnd({32, 32}, 33, "wv", DType::kF32);
  const LayerWeights w{wq.view(), wk.view(), wv.view()};
  for (const char* kernel : {"", "unfused_blas"}) {
    LayerOptions o;
    o.heads = 4;
    o.attention.threads = 2;
    o.attention.kernel = kernel;
    const LayerResult r = multi_head_attention(x.view(), w, o);
    EXPECT_GE(core::pool_threads(), 1) << "the layer ran on 2 threads";
    EXPECT_EQ(process_threads(), 1 + core::pool_threads())
        << "after the layer with kernel '" << kernel << "'";
    const Tensor y = linear(x.view(), wq.view(), std::nullopt);
    EXPECT_EQ(process_threads(), 1 + core::pool_threads()) << "after linear()";
  }
  // Parked means no CPU time: 100 ms asleep costs the process (nearly) none. A spinning
  // thread would take ~100 ms.
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LT(process_cpu_seconds() - before, 0.02) << "a thread kept running while idle";
  // A program that asks OpenBLAS for threads of its own keeps them: qkv runs its calls at one
  // BLAS thread and then gives the count back (kernels/blas_threads.h).
  if (openblas_set_num_threads != nullptr && openblas_get_num_threads != nullptr) {
    openblas_set_num_threads(2);
    const Tensor y = linear(x.view(), wq.view(), std::nullopt);
    EXPECT_EQ(openblas_get_num_threads(), 2)
        << "after linear(), OpenBLAS set to 2 threads before it";
    // Given back without starting OpenBLAS's pool: that is the program's next threaded call.
    EXPECT_EQ(process_threads(), 1 + core::pool_threads()) << "after linear(), at 2 threads";
  }
}

void expect_layer_error(const TensorView& x, const LayerWeights& w, const LayerOptions& o,
                        const std::string& subject, const std::string& fragment) {
  try {
    multi_head_attention(x, w, o);
    ADD_FAILURE() << "expected an error about " << subject;
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), subject) << e.what();
    EXPECT_NE(e.problem().find(fragment), std::string::npos) << e.what();
  }
}

TEST(MultiHeadAttention, ShapeErrorsNameTheFile) {
  const Tensor x = rnd({7, 16}, 1, "x.npy");
  const Tensor wq = rnd({16, 12}, 2, "wq.npy");
  const Tensor wk = rnd({16, 12}, 3, "wk.npy");
  const Tensor wv = rnd({16, 12}, 4, "wv.npy");
  const Tensor wrong_rows = rnd({15, 12}, 5, "wk15.npy");
  const Tensor bo = rnd({12}, 6, "bo.npy");
  const Tensor bq_short = rnd({11}, 7, "bq.npy");
  LayerOptions o;
  o.heads = 4;
  expect_layer_error(x.view(), {wq.view(), wrong_rows.view(), wv.view()}, o, "wk15.npy",
                     "has 15 rows but x.npy has width 16");
  LayerOptions five = o;
  five.heads = 5;
  expect_layer_error(x.view(), {wq.view(), wk.view(), wv.view()}, five, "wq.npy",
                     "do not split into 5 heads");
  LayerWeights bias_only{wq.view(), wk.view(), wv.view()};
  bias_only.bo = bo.view();
  expect_layer_error(x.view(), bias_only, o, "bo.npy", "needs an output projection");
  LayerWeights short_bias{wq.view(), wk.view(), wv.view()};
  short_bias.bq = bq_short.view();
  expect_layer_error(x.view(), short_bias, o, "bq.npy", "has 11 entries");
  LayerOptions gqa = o;
  gqa.kv_heads = 2;  // W^K then needs 2 x 3 = 6 columns
  expect_layer_error(x.view(), {wq.view(), wk.view(), wv.view()}, gqa, "wk.npy",
                     "expected 2 kv heads x dk 3 = 6");
  Tensor nan_x = rnd({7, 16}, 8, "nan.npy");
  nan_x.data_as<double>()[3] = std::numeric_limits<double>::quiet_NaN();
  expect_layer_error(nan_x.view(), {wq.view(), wk.view(), wv.view()}, o, "nan.npy", "NaN");
}

TEST(Linear, ProjectsRowsWithBias) {
  const double x[] = {1, 2, 3, 4};        // [2, 2]
  const double w[] = {1, 0, 1, 0, 1, 1};  // [2, 3]
  const double b[] = {10, 20, 30};
  const TensorView xv{x, DType::kF64, {2, 2}, {2, 1}, "x"};
  const TensorView wv{w, DType::kF64, {2, 3}, {3, 1}, "w"};
  const TensorView bv{b, DType::kF64, {3}, {1}, "b"};
  const Tensor y = linear(xv, wv, bv);
  const double expected[] = {11, 22, 33, 13, 24, 37};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y.data_as<double>()[i], expected[i]);
}

}  // namespace
}  // namespace qkv
