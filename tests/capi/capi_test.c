/* The C API from C: results against values worked out here (by hand or by a plain float64
 * loop), every error path with its status and message, and the ABI rules (struct_size from an
 * older or newer client). Outputs are float32 unless stated; float32 rounding of values of
 * magnitude <= 4 is below 1e-6, so kTol = 1e-6 is the tolerance throughout. */
#define _POSIX_C_SOURCE 200809L /* pthreads under -std=c99 */

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv/qkv_c.h"

static const double kTol = 1e-6;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: \"%s\")\n", __FILE__, __LINE__, \
              #cond, qkv_last_error());                                                       \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

#define CHECK_OK(call)                                                                       \
  do {                                                                                       \
    qkv_status status_ = (call);                                                             \
    if (status_ != QKV_OK) {                                                                 \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call,              \
              qkv_status_name(status_), qkv_last_error());                                   \
      exit(1);                                                                               \
    }                                                                                        \
    CHECK(qkv_last_error()[0] == '\0');                                                      \
  } while (0)

/* The call fails with `expected` and a message that contains `needle`. */
#define CHECK_ERROR(call, expected, needle)                                                  \
  do {                                                                                       \
    qkv_status status_ = (call);                                                             \
    if (status_ != (expected) || strstr(qkv_last_error(), (needle)) == NULL) {               \
      fprintf(stderr, "%s:%d: %s returned %s (\"%s\"); expected %s with \"%s\"\n", __FILE__, \
              __LINE__, #call, qkv_status_name(status_), qkv_last_error(),                   \
              qkv_status_name(expected), (needle));                                          \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

#define CHECK_NEAR(actual, expected)                                                      \
  do {                                                                                    \
    double a_ = (actual), e_ = (expected);                                                \
    if (!(fabs(a_ - e_) <= kTol)) {                                                       \
      fprintf(stderr, "%s:%d: %s = %.9g, expected %.9g (tolerance %g)\n", __FILE__,       \
              __LINE__, #actual, a_, e_, kTol);                                           \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static qkv_tensor make_tensor(void* data, qkv_dtype dtype, int32_t rank, const int64_t* shape,
                              const char* name) {
  qkv_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  t.shape = shape;
  t.name = name;
  return t;
}

/* One head of attention in float64: scores scale·q_i·k_j (+ -inf where mask is 0 or causal
 * forbids), softmax, weighted sum of v. Writes out [nq, dv] and lse [nq]. */
static void naive_head(const float* q, const float* k, const float* v, int nq, int nk, int d,
                       int dv, double scale, int causal, const unsigned char* mask, double* out,
                       double* lse) {
  int i, j, c;
  for (i = 0; i < nq; ++i) {
    double s[16], max = -INFINITY, sum = 0.0;
    for (j = 0; j < nk; ++j) {
      double dot = 0.0;
      for (c = 0; c < d; ++c) dot += (double)q[i * d + c] * k[j * d + c];
      s[j] = scale * dot;
      if ((causal && j > i + (nk - nq)) || (mask != NULL && !mask[i * nk + j])) s[j] = -INFINITY;
      if (s[j] > max) max = s[j];
    }
    for (j = 0; j < nk; ++j) sum += exp(s[j] - max);
    for (c = 0; c < dv; ++c) {
      double acc = 0.0;
      for (j = 0; j < nk; ++j) acc += exp(s[j] - max) / sum * v[j * dv + c];
      out[i * dv + c] = acc;
    }
    if (lse != NULL) lse[i] = max + log(sum);
  }
}

/* q = [1, 0], keys [1, 0] and [0, 1], scale 1: scores [1, 0], weights [e, 1] / (e + 1). */
static const float kQ[] = {1, 0};
static const float kK[] = {1, 0, 0, 1};
static const float kV[] = {1, 2, 3, 4};
static const int64_t kShapeQ[] = {1, 2};
static const int64_t kShapeKV[] = {2, 2};

static void test_hand_computed(void) {
  const double e = exp(1.0), w0 = e / (e + 1.0), w1 = 1.0 / (e + 1.0);
  float out[2] = {0, 0}, weights[2] = {0, 0}, lse[1] = {0};
  const int64_t weights_shape[] = {1, 2}, lse_shape[] = {1};
  qkv_tensor q = make_tensor((void*)kQ, QKV_F32, 2, kShapeQ, "q");
  qkv_tensor k = make_tensor((void*)kK, QKV_F32, 2, kShapeKV, "k");
  qkv_tensor v = make_tensor((void*)kV, QKV_F32, 2, kShapeKV, "v");
  qkv_tensor o = make_tensor(out, QKV_F32, 2, kShapeQ, "out");
  qkv_tensor w = make_tensor(weights, QKV_F32, 2, weights_shape, "weights");
  qkv_tensor l = make_tensor(lse, QKV_F32, 1, lse_shape, "lse");
  qkv_attention_options options;
  qkv_attention_options_init(&options);
  options.has_scale = 1;
  options.scale = 1.0;
  CHECK_OK(qkv_attention_into(&q, &k, &v, &options, &o, &w, &l));
  CHECK_NEAR(weights[0], w0);
  CHECK_NEAR(weights[1], w1);
  CHECK_NEAR(out[0], w0 * 1 + w1 * 3);
  CHECK_NEAR(out[1], w0 * 2 + w1 * 4);
  CHECK_NEAR(lse[0], log(e + 1.0));

  /* The default scale is 1/sqrt(D): scores [1/sqrt(2), 0]. NULL options are the defaults. */
  {
    const double s = 1.0 / sqrt(2.0), d0 = exp(s) / (exp(s) + 1.0), d1 = 1.0 - d0;
    CHECK_OK(qkv_attention_into(&q, &k, &v, NULL, &o, NULL, NULL));
    CHECK_NEAR(out[0], d0 * 1 + d1 * 3);
    CHECK_NEAR(out[1], d0 * 2 + d1 * 4);
  }

  /* A strided view: the same K stored as columns of its transpose (strides 1, 2). */
  {
    const float kt[] = {1, 0, 0, 1};
    const int64_t strides[] = {1, 2};
    qkv_tensor kt_view = make_tensor((void*)kt, QKV_F32, 2, kShapeKV, "k");
    kt_view.strides = strides;
    CHECK_OK(qkv_attention_into(&q, &kt_view, &v, &options, &o, NULL, NULL));
    CHECK_NEAR(out[0], w0 * 1 + w1 * 3);
  }

  /* The result handle: float64 outputs, weights and lse on request. */
  {
    qkv_result* result = NULL;
    qkv_tensor view;
    const double* values;
    options.return_weights = 1;
    options.return_lse = 1;
    options.out_dtype = QKV_F64;
    CHECK_OK(qkv_attention(&q, &k, &v, &options, &result));
    CHECK(result != NULL);
    CHECK(qkv_result_kernel(result)[0] != '\0');
    memset(&view, 0, sizeof view);
    view.struct_size = sizeof view;
    CHECK_OK(qkv_result_tensor(result, QKV_RESULT_OUT, &view));
    CHECK(view.dtype == QKV_F64 && view.rank == 2 && view.shape[0] == 1 && view.shape[1] == 2);
    CHECK(view.strides == NULL);
    values = (const double*)view.data;
    CHECK_NEAR(values[0], w0 * 1 + w1 * 3);
    CHECK_NEAR(values[1], w0 * 2 + w1 * 4);
    CHECK_OK(qkv_result_tensor(result, QKV_RESULT_WEIGHTS, &view));
    CHECK(view.rank == 2 && view.shape[1] == 2);
    CHECK_NEAR(((const double*)view.data)[0], w0);
    CHECK_OK(qkv_result_tensor(result, QKV_RESULT_LSE, &view));
    CHECK(view.rank == 1 && view.shape[0] == 1);
    CHECK_NEAR(((const double*)view.data)[0], log(e + 1.0));
    qkv_result_free(result);

    options.return_weights = 0;
    CHECK_OK(qkv_attention(&q, &k, &v, &options, &result));
    CHECK_ERROR(qkv_result_tensor(result, QKV_RESULT_WEIGHTS, &view),
                QKV_ERROR_INVALID_ARGUMENT, "weights: is not in this result");
    CHECK_ERROR(qkv_result_tensor(result, (qkv_result_part)7, &view),
                QKV_ERROR_INVALID_ARGUMENT, "part: 7 is not a qkv_result_part");
    view.struct_size = 4;
    CHECK_ERROR(qkv_result_tensor(result, QKV_RESULT_OUT, &view), QKV_ERROR_INVALID_ARGUMENT,
                "view: struct_size 4");
    qkv_result_free(result);
    qkv_result_free(NULL);
  }
}

/* Three queries, three keys (D = 2, Dv = 2): causal, a bool mask and a window against the
 * float64 loop. */
static const float kQ3[] = {0.5f, -1.0f, 1.5f, 0.25f, -0.75f, 2.0f};
static const float kK3[] = {1.0f, 0.5f, -0.5f, 1.0f, 2.0f, -1.0f};
static const float kV3[] = {1.0f, -2.0f, 0.5f, 3.0f, -1.5f, 0.25f};
static const int64_t kShape3[] = {3, 2};

static void test_masks(void) {
  float out[6];
  double expected[6];
  int i;
  qkv_tensor q = make_tensor((void*)kQ3, QKV_F32, 2, kShape3, "q");
  qkv_tensor k = make_tensor((void*)kK3, QKV_F32, 2, kShape3, "k");
  qkv_tensor v = make_tensor((void*)kV3, QKV_F32, 2, kShape3, "v");
  qkv_tensor o = make_tensor(out, QKV_F32, 2, kShape3, "out");
  qkv_attention_options options;

  qkv_attention_options_init(&options);
  options.causal = 1;
  CHECK_OK(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL));
  naive_head(kQ3, kK3, kV3, 3, 3, 2, 2, 1.0 / sqrt(2.0), 1, NULL, expected, NULL);
  for (i = 0; i < 6; ++i) CHECK_NEAR(out[i], expected[i]);
  /* Row 0 sees key 0 alone. */
  CHECK_NEAR(out[0], kV3[0]);

  {
    /* True = may attend; broadcast from [3, 3]. The anti-causal mask differs from causal. */
    unsigned char mask[9] = {1, 1, 1, 0, 1, 1, 0, 0, 1};
    const int64_t mask_shape[] = {3, 3};
    qkv_tensor m = make_tensor(mask, QKV_BOOL, 2, mask_shape, "mask");
    qkv_attention_options_init(&options);
    options.mask = &m;
    CHECK_OK(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL));
    naive_head(kQ3, kK3, kV3, 3, 3, 2, 2, 1.0 / sqrt(2.0), 0, mask, expected, NULL);
    for (i = 0; i < 6; ++i) CHECK_NEAR(out[i], expected[i]);
    CHECK_NEAR(out[4], kV3[4]);
  }

  {
    /* window left 0, right 0: each query sees only its own key, so out = v. */
    qkv_attention_options_init(&options);
    options.has_window = 1;
    options.window_left = 0;
    options.window_right = 0;
    CHECK_OK(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL));
    for (i = 0; i < 6; ++i) CHECK_NEAR(out[i], kV3[i]);
  }
}

/* No query rows: NULL data is fine for an empty tensor, and the result has an empty out. */
static void test_empty(void) {
  const int64_t no_rows[] = {0, 2};
  qkv_tensor q = make_tensor(NULL, QKV_F32, 2, no_rows, "q");
  qkv_tensor k = make_tensor((void*)kK3, QKV_F32, 2, kShape3, "k");
  qkv_tensor v = make_tensor((void*)kV3, QKV_F32, 2, kShape3, "v");
  qkv_result* result = NULL;
  qkv_tensor view;
  CHECK_OK(qkv_attention(&q, &k, &v, NULL, &result));
  memset(&view, 0, sizeof view);
  view.struct_size = sizeof view;
  CHECK_OK(qkv_result_tensor(result, QKV_RESULT_OUT, &view));
  CHECK(view.rank == 2 && view.shape[0] == 0 && view.shape[1] == 2 && view.data != NULL);
  qkv_result_free(result);
}

/* Grouped-query: 4 query heads read 2 kv heads (head h reads kv head h / 2). */
static void test_gqa(void) {
  float q[4 * 2 * 2], k[2 * 3 * 2], v[2 * 3 * 2], out[4 * 2 * 2];
  double expected[2 * 2];
  const int64_t q_shape[] = {4, 2, 2}, kv_shape[] = {2, 3, 2};
  int i, h;
  for (i = 0; i < 16; ++i) q[i] = (float)((i * 7) % 5) * 0.5f - 1.0f;
  for (i = 0; i < 12; ++i) k[i] = (float)((i * 3) % 7) * 0.25f - 0.5f;
  for (i = 0; i < 12; ++i) v[i] = (float)((i * 5) % 11) * 0.3f - 1.5f;
  {
    qkv_tensor qt = make_tensor(q, QKV_F32, 3, q_shape, "q");
    qkv_tensor kt = make_tensor(k, QKV_F32, 3, kv_shape, "k");
    qkv_tensor vt = make_tensor(v, QKV_F32, 3, kv_shape, "v");
    qkv_tensor ot = make_tensor(out, QKV_F32, 3, q_shape, "out");
    CHECK_OK(qkv_attention_into(&qt, &kt, &vt, NULL, &ot, NULL, NULL));
  }
  for (h = 0; h < 4; ++h) {
    naive_head(q + h * 4, k + (h / 2) * 6, v + (h / 2) * 6, 2, 3, 2, 2, 1.0 / sqrt(2.0), 0, NULL,
               expected, NULL);
    for (i = 0; i < 4; ++i) CHECK_NEAR(out[h * 4 + i], expected[i]);
  }
}

/* The layer with identity projections is attention of X itself; with two heads of width 1 each
 * head is attention of one column (scale 1/sqrt(1)); W^O = I with a bias adds the bias. */
static void test_layer(void) {
  const float identity[] = {1, 0, 0, 1};
  const float bias[] = {0.5f, -2.0f};
  const int64_t w_shape[] = {2, 2}, b_shape[] = {2};
  qkv_tensor x = make_tensor((void*)kQ3, QKV_F32, 2, kShape3, "x");
  qkv_tensor wi = make_tensor((void*)identity, QKV_F32, 2, w_shape, "w");
  qkv_tensor bo = make_tensor((void*)bias, QKV_F32, 1, b_shape, "bo");
  qkv_layer_weights weights;
  qkv_layer_options options;
  qkv_attention_options attention;
  qkv_result* result = NULL;
  qkv_tensor view;
  double expected[6], column[3], x_column[3];
  float xc[3];
  const float* values;
  int i, h;

  qkv_layer_weights_init(&weights);
  weights.wq = &wi;
  weights.wk = &wi;
  weights.wv = &wi;
  qkv_layer_options_init(&options);
  CHECK_OK(qkv_multi_head_attention(&x, &weights, &options, NULL, &result));
  memset(&view, 0, sizeof view);
  view.struct_size = sizeof view;
  CHECK_OK(qkv_result_tensor(result, QKV_RESULT_OUT, &view));
  CHECK(view.dtype == QKV_F32 && view.rank == 2 && view.shape[0] == 3 && view.shape[1] == 2);
  values = (const float*)view.data;
  naive_head(kQ3, kQ3, kQ3, 3, 3, 2, 2, 1.0 / sqrt(2.0), 0, NULL, expected, NULL);
  for (i = 0; i < 6; ++i) CHECK_NEAR(values[i], expected[i]);
  qkv_result_free(result);

  options.heads = 2;
  qkv_attention_options_init(&attention);
  attention.causal = 1;
  options.attention = &attention;
  weights.wo = &wi;
  weights.bo = &bo;
  CHECK_OK(qkv_multi_head_attention(&x, &weights, &options, NULL, &result));
  CHECK_OK(qkv_result_tensor(result, QKV_RESULT_OUT, &view));
  values = (const float*)view.data;
  for (h = 0; h < 2; ++h) {
    for (i = 0; i < 3; ++i) xc[i] = kQ3[i * 2 + h];
    naive_head(xc, xc, xc, 3, 3, 1, 1, 1.0, 1, NULL, column, NULL);
    for (i = 0; i < 3; ++i) x_column[i] = column[i] + bias[h];
    for (i = 0; i < 3; ++i) CHECK_NEAR(values[i * 2 + h], x_column[i]);
  }
  qkv_result_free(result);

  /* Cross-attention: K and V from a memory of two rows (kK3's first two), identity weights. */
  {
    const int64_t memory_shape[] = {2, 2};
    qkv_tensor memory = make_tensor((void*)kK3, QKV_F32, 2, memory_shape, "memory");
    qkv_layer_options_init(&options);
    weights.wo = NULL;
    weights.bo = NULL;
    CHECK_OK(qkv_multi_head_attention(&x, &weights, &options, &memory, &result));
    CHECK_OK(qkv_result_tensor(result, QKV_RESULT_OUT, &view));
    CHECK(view.rank == 2 && view.shape[0] == 3 && view.shape[1] == 2);
    naive_head(kQ3, kK3, kK3, 3, 2, 2, 2, 1.0 / sqrt(2.0), 0, NULL, expected, NULL);
    for (i = 0; i < 6; ++i) CHECK_NEAR(((const float*)view.data)[i], expected[i]);
    qkv_result_free(result);
    options.heads = 2;
  }

  result = (qkv_result*)&view; /* a sentinel: a failed call must not write *result */
  weights.wk = NULL;
  CHECK_ERROR(qkv_multi_head_attention(&x, &weights, &options, NULL, &result),
              QKV_ERROR_INVALID_ARGUMENT, "wk: must not be NULL");
  CHECK(result == (qkv_result*)&view);
  weights.wk = &wi;
  options.heads = 3;
  CHECK_ERROR(qkv_multi_head_attention(&x, &weights, &options, NULL, &result),
              QKV_ERROR_INVALID_ARGUMENT, "");
  CHECK(qkv_last_error()[0] != '\0');
  CHECK(result == (qkv_result*)&view);
  options.heads = 1;
  options.struct_size = 0;
  CHECK_ERROR(qkv_multi_head_attention(&x, &weights, &options, NULL, &result),
              QKV_ERROR_INVALID_ARGUMENT, "options: struct_size 0 is smaller");
  CHECK_ERROR(qkv_multi_head_attention(&x, NULL, &options, NULL, &result),
              QKV_ERROR_INVALID_ARGUMENT, "weights: must not be NULL");
}

/* Rows appended to a cache give the same attention as the same rows passed to attention. */
static void test_kv_cache(void) {
  qkv_kv_cache_options cache_options;
  qkv_kv_cache* cache = NULL;
  qkv_attention_options options;
  qkv_result* result = NULL;
  qkv_tensor view;
  int64_t a = -1, b = -1, length = -1, pages = -1;
  float out[2 * 2];
  double expected[4];
  const int64_t two_rows[] = {2, 2}, one_row[] = {1, 2}, q1_shape[] = {1, 1, 2};
  const int64_t q2_shape[] = {2, 1, 1, 2};
  const float extra_a[] = {0.75f, -0.25f}, extra_b[] = {-1.0f, 1.25f};
  float k_b[3 * 2], v_b[3 * 2], q2[4];
  int i;

  qkv_kv_cache_options_init(&cache_options);
  cache_options.d = 2;
  cache_options.dv = 2;
  cache_options.page_rows = 2;
  CHECK_OK(qkv_kv_cache_create(&cache_options, &cache));
  CHECK_OK(qkv_kv_cache_add_sequence(cache, &a));
  {
    /* The first two rows of kK3 / kV3, then the third: three rows in two pages. */
    qkv_tensor k = make_tensor((void*)kK3, QKV_F32, 2, two_rows, "k");
    qkv_tensor v = make_tensor((void*)kV3, QKV_F32, 2, two_rows, "v");
    qkv_tensor k2 = make_tensor((void*)(kK3 + 4), QKV_F32, 2, one_row, "k");
    qkv_tensor v2 = make_tensor((void*)(kV3 + 4), QKV_F32, 2, one_row, "v");
    CHECK_OK(qkv_kv_cache_append(cache, a, &k, &v));
    /* b shares a's two rows, then each gets its own third row. */
    CHECK_OK(qkv_kv_cache_fork(cache, a, &b));
    CHECK_OK(qkv_kv_cache_append(cache, a, &k2, &v2));
    k2.data = (void*)extra_a;
    v2.data = (void*)extra_b;
    CHECK_OK(qkv_kv_cache_append(cache, b, &k2, &v2));
  }
  CHECK_OK(qkv_kv_cache_length(cache, a, &length));
  CHECK(length == 3);
  CHECK_OK(qkv_kv_cache_pages_in_use(cache, &pages));
  CHECK(pages == 3);

  /* One sequence, [H, Nq, D]: the last query row of kQ3 against a's three rows, causal. */
  {
    qkv_tensor q = make_tensor((void*)(kQ3 + 4), QKV_F32, 3, q1_shape, "q");
    qkv_attention_options_init(&options);
    options.causal = 1;
    options.return_lse = 1;
    CHECK_OK(qkv_attention_cached(cache, &q, &a, 1, &options, &result));
    memset(&view, 0, sizeof view);
    view.struct_size = sizeof view;
    CHECK_OK(qkv_result_tensor(result, QKV_RESULT_OUT, &view));
    CHECK(view.rank == 3 && view.shape[0] == 1 && view.shape[1] == 1 && view.shape[2] == 2);
    {
      double lse;
      naive_head(kQ3 + 4, kK3, kV3, 1, 3, 2, 2, 1.0 / sqrt(2.0), 1, NULL, expected, &lse);
      CHECK_NEAR(((const float*)view.data)[0], expected[0]);
      CHECK_NEAR(((const float*)view.data)[1], expected[1]);
      CHECK_OK(qkv_result_tensor(result, QKV_RESULT_LSE, &view));
      CHECK_NEAR(((const float*)view.data)[0], lse);
    }
    qkv_result_free(result);
  }

  /* Two sequences in one call, [S, H, Nq, D], each against its own rows via plain attention. */
  {
    const int64_t both[2] = {a, b};
    qkv_tensor q = make_tensor(q2, QKV_F32, 4, q2_shape, "q");
    qkv_tensor kb = make_tensor(k_b, QKV_F32, 2, kShape3, "k");
    qkv_tensor vb = make_tensor(v_b, QKV_F32, 2, kShape3, "v");
    qkv_tensor qb = make_tensor(q2 + 2, QKV_F32, 2, one_row, "q");
    qkv_tensor ob = make_tensor(out, QKV_F32, 2, one_row, "out");
    float direct[2];
    const float* cached;
    for (i = 0; i < 4; ++i) q2[i] = kQ3[i + 1];
    memcpy(k_b, kK3, 4 * sizeof(float));
    memcpy(v_b, kV3, 4 * sizeof(float));
    memcpy(k_b + 4, extra_a, sizeof extra_a);
    memcpy(v_b + 4, extra_b, sizeof extra_b);
    CHECK_OK(qkv_attention_cached(cache, &q, both, 2, NULL, &result));
    CHECK_OK(qkv_result_tensor(result, QKV_RESULT_OUT, &view));
    CHECK(view.rank == 4 && view.shape[0] == 2);
    cached = (const float*)view.data;
    naive_head(q2, kK3, kV3, 1, 3, 2, 2, 1.0 / sqrt(2.0), 0, NULL, expected, NULL);
    CHECK_NEAR(cached[0], expected[0]);
    CHECK_NEAR(cached[1], expected[1]);
    CHECK_OK(qkv_attention_into(&qb, &kb, &vb, NULL, &ob, NULL, NULL));
    direct[0] = out[0];
    direct[1] = out[1];
    CHECK_NEAR(cached[2], direct[0]);
    CHECK_NEAR(cached[3], direct[1]);
    qkv_result_free(result);

    /* Errors: an unknown sequence, a mask (refused by the cache), NULL sequences. */
    result = NULL;
    {
      const int64_t unknown[2] = {a, 99};
      CHECK_ERROR(qkv_attention_cached(cache, &q, unknown, 2, NULL, &result),
                  QKV_ERROR_INVALID_ARGUMENT, "sequence 99");
      CHECK_ERROR(qkv_attention_cached(cache, &q, NULL, 2, NULL, &result),
                  QKV_ERROR_INVALID_ARGUMENT, "sequences: must not be NULL");
      CHECK_ERROR(qkv_attention_cached(NULL, &q, both, 2, NULL, &result),
                  QKV_ERROR_INVALID_ARGUMENT, "cache: must not be NULL");
    }
    CHECK(result == NULL);
  }

  /* Forgetting, removing, and the errors that leave the cache as it was. */
  {
    qkv_tensor k = make_tensor((void*)kK3, QKV_F32, 2, kShape3, "new_keys");
    qkv_tensor v = make_tensor((void*)kV3, QKV_F32, 2, two_rows, "v");
    CHECK_ERROR(qkv_kv_cache_append(cache, a, &k, &v), QKV_ERROR_INVALID_ARGUMENT, "");
    CHECK(strstr(qkv_last_error(), "new_keys") != NULL || strstr(qkv_last_error(), "v") != NULL);
    CHECK_OK(qkv_kv_cache_length(cache, a, &length));
    CHECK(length == 3);
    CHECK_ERROR(qkv_kv_cache_append(cache, a, NULL, &v), QKV_ERROR_INVALID_ARGUMENT,
                "k: must not be NULL");
    CHECK_ERROR(qkv_kv_cache_forget_before(cache, a, 7), QKV_ERROR_INVALID_ARGUMENT, "");
    CHECK_OK(qkv_kv_cache_forget_before(cache, a, 2));
    CHECK_OK(qkv_kv_cache_remove(cache, b));
    CHECK_ERROR(qkv_kv_cache_length(cache, b, &length), QKV_ERROR_INVALID_ARGUMENT,
                "not in this cache");
    CHECK_ERROR(qkv_kv_cache_length(cache, a, NULL), QKV_ERROR_INVALID_ARGUMENT,
                "length: must not be NULL");
    CHECK_ERROR(qkv_kv_cache_add_sequence(NULL, &b), QKV_ERROR_INVALID_ARGUMENT,
                "cache: must not be NULL");
  }
  qkv_kv_cache_destroy(cache);
  qkv_kv_cache_destroy(NULL);

  /* Capacity: one page of two rows; a third row is QKV_ERROR_LIMIT and changes nothing. */
  cache_options.max_pages = 1;
  CHECK_OK(qkv_kv_cache_create(&cache_options, &cache));
  CHECK_OK(qkv_kv_cache_add_sequence(cache, &a));
  {
    qkv_tensor k = make_tensor((void*)kK3, QKV_F32, 2, kShape3, "k");
    qkv_tensor v = make_tensor((void*)kV3, QKV_F32, 2, kShape3, "v");
    CHECK_ERROR(qkv_kv_cache_append(cache, a, &k, &v), QKV_ERROR_LIMIT, "KVCache capacity");
    CHECK_OK(qkv_kv_cache_length(cache, a, &length));
    CHECK(length == 0);
  }
  qkv_kv_cache_destroy(cache);

  cache = NULL;
  cache_options.kv_heads = 0;
  CHECK_ERROR(qkv_kv_cache_create(&cache_options, &cache), QKV_ERROR_INVALID_ARGUMENT,
              "KVCache");
  cache_options.kv_heads = 1;
  cache_options.storage = (qkv_cache_storage)9;
  CHECK_ERROR(qkv_kv_cache_create(&cache_options, &cache), QKV_ERROR_INVALID_ARGUMENT,
              "storage: 9 is not a qkv_cache_storage");
  CHECK(cache == NULL);
  CHECK_ERROR(qkv_kv_cache_create(NULL, &cache), QKV_ERROR_INVALID_ARGUMENT,
              "options: must not be NULL");
}

/* Every error of qkv_attention_into: a status, a message naming the subject, and the caller's
 * output untouched. */
static void test_errors(void) {
  float out[2] = {42.0f, 42.0f};
  const int64_t bad_k_shape[] = {2, 3}, negative[] = {-1, 2}, out_shape_wrong[] = {2, 2};
  qkv_tensor q = make_tensor((void*)kQ, QKV_F32, 2, kShapeQ, "q");
  qkv_tensor k = make_tensor((void*)kK, QKV_F32, 2, kShapeKV, "k");
  qkv_tensor v = make_tensor((void*)kV, QKV_F32, 2, kShapeKV, "v");
  qkv_tensor o = make_tensor(out, QKV_F32, 2, kShapeQ, "out");
  qkv_tensor bad;
  qkv_attention_options options;
  qkv_result* result = NULL;

  CHECK_ERROR(qkv_attention_into(NULL, &k, &v, NULL, &o, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "q: must not be NULL");
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, NULL, NULL, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "out: must not be NULL");
  CHECK_ERROR(qkv_attention(&q, &k, &v, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "result: must not be NULL");

  /* A key width that is not Q's, in a tensor that names itself. */
  bad = make_tensor((void*)kK, QKV_F32, 2, bad_k_shape, "keys.npy");
  CHECK_ERROR(qkv_attention_into(&q, &bad, &v, NULL, &o, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "keys.npy");
  /* Without a name, the argument's. */
  bad.name = NULL;
  CHECK_ERROR(qkv_attention_into(&q, &bad, &v, NULL, &o, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "k: ");
  bad = make_tensor((void*)kK, QKV_F32, 2, negative, NULL);
  CHECK_ERROR(qkv_attention_into(&q, &bad, &v, NULL, &o, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "k: shape [-1, 2] has a negative dimension");
  bad = make_tensor((void*)kK, QKV_F32, 2, NULL, NULL);
  CHECK_ERROR(qkv_attention_into(&q, &bad, &v, NULL, &o, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "k: shape must not be NULL");
  bad = make_tensor(NULL, QKV_F32, 2, kShapeKV, NULL);
  CHECK_ERROR(qkv_attention_into(&q, &bad, &v, NULL, &o, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "k: data must not be NULL");
  bad = make_tensor((void*)kK, QKV_F32, QKV_MAX_RANK + 1, kShapeKV, NULL);
  CHECK_ERROR(qkv_attention_into(&q, &bad, &v, NULL, &o, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "k: rank 33 is outside");
  bad = make_tensor((void*)kK, (qkv_dtype)99, 2, kShapeKV, NULL);
  CHECK_ERROR(qkv_attention_into(&q, &bad, &v, NULL, &o, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "k: dtype 99 is not a qkv_dtype");
  bad = make_tensor((void*)kK, QKV_F32, 2, kShapeKV, NULL);
  bad.struct_size = 0;
  CHECK_ERROR(qkv_attention_into(&q, &bad, &v, NULL, &o, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "k: struct_size 0 is smaller than the first version's");
  bad = make_tensor(out, QKV_F32, 2, out_shape_wrong, NULL);
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, NULL, &bad, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "out: output shape [2, 2] should be [1, 2]");

  qkv_attention_options_init(&options);
  options.kernel = "no_such_kernel";
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL),
              QKV_ERROR_INVALID_ARGUMENT, "kernel no_such_kernel: no such kernel");
  qkv_attention_options_init(&options);
  options.struct_size = 8;
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL),
              QKV_ERROR_INVALID_ARGUMENT, "options: struct_size 8 is smaller");
  /* Between two versions' sizes: the tail would be half a field. */
  options.struct_size = QKV_ATTENTION_OPTIONS_V1_SIZE + 4;
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL),
              QKV_ERROR_INVALID_ARGUMENT, "is not the size of any version");
  qkv_attention_options_init(&options);
  options.out_dtype = (qkv_dtype)42;
  CHECK_ERROR(qkv_attention(&q, &k, &v, &options, &result), QKV_ERROR_INVALID_ARGUMENT,
              "out_dtype: dtype 42");
  CHECK(result == NULL);
  qkv_attention_options_init(&options);
  options.threads = -2;
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL),
              QKV_ERROR_INVALID_ARGUMENT, "threads");
  qkv_attention_options_init(&options);
  options.max_memory = 1;
  CHECK_ERROR(qkv_attention(&q, &k, &v, &options, &result), QKV_ERROR_LIMIT, "max_memory");
  CHECK(result == NULL);

  CHECK(out[0] == 42.0f && out[1] == 42.0f);

  /* A later successful call clears the message. */
  CHECK_OK(qkv_attention_into(&q, &k, &v, NULL, &o, NULL, NULL));
  CHECK(out[0] != 42.0f);
}

/* The ABI rules: a client compiled before the version 2 fields existed sets a smaller
 * struct_size; the library must not read past it. A newer client's unknown fields must be
 * zero. */
static void test_struct_sizes(void) {
  float out[2] = {0, 0}, reference[2] = {0, 0};
  qkv_tensor q = make_tensor((void*)kQ, QKV_F32, 2, kShapeQ, "q");
  qkv_tensor k = make_tensor((void*)kK, QKV_F32, 2, kShapeKV, "k");
  qkv_tensor v = make_tensor((void*)kV, QKV_F32, 2, kShapeKV, "v");
  qkv_tensor o = make_tensor(out, QKV_F32, 2, kShapeQ, "out");
  qkv_tensor r = make_tensor(reference, QKV_F32, 2, kShapeQ, "out");
  qkv_attention_options options;
  struct {
    qkv_attention_options options;
    uint64_t unknown; /* a field of a header newer than this library */
  } newer;

  qkv_attention_options_init(&options);
  options.has_scale = 1;
  options.scale = 1.0;
  CHECK_OK(qkv_attention_into(&q, &k, &v, &options, &r, NULL, NULL));

  /* Past the old client's struct_size is memory it never set: garbage the library must ignore
   * (an invalid dtype and a softcap that would change the result). */
  options.struct_size = QKV_ATTENTION_OPTIONS_V1_SIZE;
  options.dtype = (qkv_dtype)77;
  options.softcap = 0.01;
  CHECK_OK(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL));
  CHECK(out[0] == reference[0] && out[1] == reference[1]);
  /* The same fields within struct_size are read: the softcap changes the result. */
  options.struct_size = sizeof options;
  options.dtype = QKV_DTYPE_DEFAULT;
  CHECK_OK(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL));
  CHECK(fabs(out[0] - reference[0]) > 1e-3);
  options.dtype = (qkv_dtype)77;
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, &options, &o, NULL, NULL),
              QKV_ERROR_INVALID_ARGUMENT, "dtype: dtype 77");

  memset(&newer, 0, sizeof newer);
  qkv_attention_options_init(&newer.options);
  newer.options.struct_size = sizeof newer;
  newer.options.has_scale = 1;
  newer.options.scale = 1.0;
  CHECK_OK(qkv_attention_into(&q, &k, &v, &newer.options, &o, NULL, NULL));
  CHECK(out[0] == reference[0] && out[1] == reference[1]);
  newer.unknown = 1;
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, &newer.options, &o, NULL, NULL),
              QKV_ERROR_INVALID_ARGUMENT, "comes from a newer qkv");
  newer.options.struct_size = 1u << 20;
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, &newer.options, &o, NULL, NULL),
              QKV_ERROR_INVALID_ARGUMENT, "implausibly large");
}

/* qkv_read_npy: a file written here by hand (version 1.0, <f4, shape (2, 3)), a missing file
 * and a truncated one. */
static void test_read_npy(const char* directory) {
  char path[4096];
  const float values[6] = {1.5f, -2.0f, 0.25f, 3.0f, 4.5f, -0.125f};
  char header[118];
  const char* dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  FILE* file;
  qkv_result* result = NULL;
  qkv_tensor view;
  int i;
  /* 10 bytes of magic, version and length, then the dict padded with spaces to a multiple of
   * 64 bytes in all, ending in a newline. */
  memset(header, ' ', sizeof header);
  memcpy(header, dict, strlen(dict));
  header[sizeof header - 1] = '\n';
  snprintf(path, sizeof path, "%s/capi_test_input.npy", directory);
  file = fopen(path, "wb");
  CHECK(file != NULL);
  CHECK(fwrite("\x93NUMPY\x01\x00\x76\x00", 1, 10, file) == 10);
  CHECK(fwrite(header, 1, sizeof header, file) == sizeof header);
  CHECK(fwrite(values, sizeof(float), 6, file) == 6);
  CHECK(fclose(file) == 0);

  CHECK_OK(qkv_read_npy(path, &result));
  memset(&view, 0, sizeof view);
  view.struct_size = sizeof view;
  CHECK_OK(qkv_result_tensor(result, QKV_RESULT_OUT, &view));
  CHECK(view.dtype == QKV_F32 && view.rank == 2 && view.shape[0] == 2 && view.shape[1] == 3);
  for (i = 0; i < 6; ++i) CHECK(((const float*)view.data)[i] == values[i]);
  CHECK(strcmp(qkv_result_kernel(result), "") == 0);
  qkv_result_free(result);

  /* Truncated: the header promises 24 bytes of data, 8 are there. */
  file = fopen(path, "wb");
  CHECK(file != NULL);
  CHECK(fwrite("\x93NUMPY\x01\x00\x76\x00", 1, 10, file) == 10);
  CHECK(fwrite(header, 1, sizeof header, file) == sizeof header);
  CHECK(fwrite(values, sizeof(float), 2, file) == 2);
  CHECK(fclose(file) == 0);
  result = NULL;
  CHECK_ERROR(qkv_read_npy(path, &result), QKV_ERROR_FILE, "capi_test_input.npy");
  CHECK(result == NULL);
  remove(path);
  CHECK_ERROR(qkv_read_npy(path, &result), QKV_ERROR_FILE, "capi_test_input.npy");
  CHECK_ERROR(qkv_read_npy(NULL, &result), QKV_ERROR_INVALID_ARGUMENT, "path: must not be NULL");
  CHECK(result == NULL);
}

/* The message is per thread: a new thread starts with none, and its failure does not replace
 * the message of the thread that started it. */
static void* fail_in_thread(void* seen) {
  qkv_status status;
  ((int*)seen)[0] = qkv_last_error()[0] == '\0';
  status = qkv_kv_cache_remove(NULL, 0);
  ((int*)seen)[1] = status == QKV_ERROR_INVALID_ARGUMENT &&
                    strcmp(qkv_last_error(), "cache: must not be NULL") == 0;
  return NULL;
}

static void test_thread_local_message(void) {
  pthread_t thread;
  int seen[2] = {0, 0};
  qkv_result* result = NULL;
  CHECK_ERROR(qkv_read_npy(NULL, &result), QKV_ERROR_INVALID_ARGUMENT, "path: must not be NULL");
  CHECK(pthread_create(&thread, NULL, fail_in_thread, seen) == 0);
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK(seen[0] && seen[1]);
  CHECK(strcmp(qkv_last_error(), "path: must not be NULL") == 0);
}

static void test_names(void) {
  CHECK(strcmp(qkv_status_name(QKV_OK), "QKV_OK") == 0);
  CHECK(strcmp(qkv_status_name(QKV_ERROR_FILE), "QKV_ERROR_FILE") == 0);
  CHECK(strcmp(qkv_status_name(QKV_ERROR_LIMIT), "QKV_ERROR_LIMIT") == 0);
  CHECK(strcmp(qkv_status_name((qkv_status)123), "unknown status") == 0);
  CHECK(strcmp(qkv_version(), QKV_EXPECTED_VERSION) == 0);
}

int main(int argc, char** argv) {
  const char* directory = argc > 1 ? argv[1] : ".";
  test_names();
  test_hand_computed();
  test_masks();
  test_gqa();
  test_empty();
  test_layer();
  test_kv_cache();
  test_errors();
  test_struct_sizes();
  test_read_npy(directory);
  test_thread_local_message();
  printf("capi_test: all checks passed\n");
  return 0;
}
