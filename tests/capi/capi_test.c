/* The C API from C: results against values worked out here (by hand or by a plain float64
 * loop), every error path with its status and message, and the ABI rules (struct_size from an
 * older or newer client). The layer, the cache and the reader are in capi_layer_cache_test.c. */
#define _POSIX_C_SOURCE 200809L /* pthreads under -std=c99 */

#include <pthread.h>

#include "capi_check.h"

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
    CHECK_ERROR(qkv_result_tensor(result, (qkv_result_part)17, &view),
                QKV_ERROR_INVALID_ARGUMENT, "part: 17 is not a qkv_result_part");
    CHECK_ERROR(qkv_result_tensor(result, (qkv_result_part)-1, &view),
                QKV_ERROR_INVALID_ARGUMENT, "part: -1 is not a qkv_result_part");
    CHECK_ERROR(qkv_result_tensor(result, QKV_RESULT_DX, &view), QKV_ERROR_INVALID_ARGUMENT,
                "dx: is not in this result");
    view.struct_size = 4;
    CHECK_ERROR(qkv_result_tensor(result, QKV_RESULT_OUT, &view), QKV_ERROR_INVALID_ARGUMENT,
                "view: struct_size 4");
    qkv_result_free(result);
    qkv_result_free(NULL);
  }
}

/* Causal, a bool mask and a window against the float64 loop. */
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

/* qkv_use_openmp_threads: a library that is not loaded, or is no OpenMP runtime, is refused in
 * one line naming it; NULL and "" are qkv's own threads (the C++ suite runs a team on a loaded
 * runtime: tests/core/openmp_team_test.cc). */
static void test_openmp_threads(void) {
  static const char not_loaded[] = "OpenMP library /nonexistent/libgomp.so.1: is not loaded";
  CHECK(qkv_use_openmp_threads("/nonexistent/libgomp.so.1") == QKV_ERROR_INVALID_ARGUMENT);
  CHECK(strncmp(qkv_last_error(), not_loaded, sizeof not_loaded - 1) == 0);
  CHECK(qkv_use_openmp_threads("libc.so.6") == QKV_ERROR_INVALID_ARGUMENT);
  CHECK(strcmp(qkv_last_error(), "OpenMP library libc.so.6: has no GOMP_parallel") == 0);
  CHECK(qkv_use_openmp_threads(NULL) == QKV_OK);
  CHECK(strcmp(qkv_last_error(), "") == 0);
  CHECK(qkv_use_openmp_threads("") == QKV_OK);
}

/* Dropout: with all-zero queries every weight is 1/64, so after dropout at p = 0.5 each is 0 or
 * exactly 1/32; the same seed draws the same mask, another seed another; p = 1 is refused; a
 * client of the version 2 struct (struct_size without the dropout fields) gets no dropout
 * whatever lies past its struct_size; the backward takes the same options. */
static void test_dropout(void) {
  enum { kRows = 4, kKeys = 64, kDim = 2 };
  static float q[kRows * kDim], k[kKeys * kDim], v[kKeys * kDim];
  float out[kRows * kDim], out2[kRows * kDim], weights[kRows * kKeys], weights2[kRows * kKeys];
  float lse[kRows];
  const int64_t q_shape[] = {kRows, kDim}, kv_shape[] = {kKeys, kDim};
  const int64_t w_shape[] = {kRows, kKeys}, lse_shape[] = {kRows};
  qkv_tensor qt = make_tensor(q, QKV_F32, 2, q_shape, "q");
  qkv_tensor kt = make_tensor(k, QKV_F32, 2, kv_shape, "k");
  qkv_tensor vt = make_tensor(v, QKV_F32, 2, kv_shape, "v");
  qkv_tensor ot = make_tensor(out, QKV_F32, 2, q_shape, "out");
  qkv_tensor ot2 = make_tensor(out2, QKV_F32, 2, q_shape, "out");
  qkv_tensor wt = make_tensor(weights, QKV_F32, 2, w_shape, "weights");
  qkv_tensor wt2 = make_tensor(weights2, QKV_F32, 2, w_shape, "weights");
  qkv_tensor lt = make_tensor(lse, QKV_F32, 1, lse_shape, "lse");
  qkv_attention_options options;
  qkv_result* grads = NULL;
  int kept = 0, differ = 0, i;
  for (i = 0; i < kKeys * kDim; ++i) {
    k[i] = (float)(i % 7) - 3.0f;
    v[i] = (float)(i % 5);
  }
  qkv_attention_options_init(&options);
  options.dropout_p = 0.5;
  options.seed = 1234;
  CHECK_OK(qkv_attention_into(&qt, &kt, &vt, &options, &ot, &wt, &lt));
  for (i = 0; i < kRows * kKeys; ++i) {
    CHECK(weights[i] == 0.0f || weights[i] == 1.0f / 32);
    kept += weights[i] != 0.0f;
  }
  /* 256 fair coins: 128 expected, a standard deviation of 8. */
  CHECK(kept > 64 && kept < 192);
  CHECK_OK(qkv_attention_into(&qt, &kt, &vt, &options, &ot2, &wt2, NULL));
  CHECK(memcmp(weights, weights2, sizeof weights) == 0 && memcmp(out, out2, sizeof out) == 0);
  options.seed = 1235;
  CHECK_OK(qkv_attention_into(&qt, &kt, &vt, &options, &ot2, &wt2, NULL));
  for (i = 0; i < kRows * kKeys; ++i) differ += weights[i] != weights2[i];
  CHECK(differ > 0);
  options.seed = 1234;
  CHECK_OK(qkv_attention_backward(&qt, &kt, &vt, &ot, &lt, &ot, &options, &grads));
  qkv_result_free(grads);
  options.dropout_p = 1.0;
  CHECK_ERROR(qkv_attention_into(&qt, &kt, &vt, &options, &ot2, NULL, NULL),
              QKV_ERROR_INVALID_ARGUMENT, "dropout_p: must be in [0, 1)");
  /* A version 2 client: the dropout fields lie past its struct_size. */
  options.dropout_p = 0.5;
  options.struct_size = QKV_ATTENTION_OPTIONS_V2_SIZE;
  CHECK_OK(qkv_attention_into(&qt, &kt, &vt, &options, &ot2, &wt2, NULL));
  for (i = 0; i < kRows * kKeys; ++i) CHECK(weights2[i] == 1.0f / 64);
}

int main(int argc, char** argv) {
  const char* directory = argc > 1 ? argv[1] : ".";
  test_names();
  test_openmp_threads();
  test_hand_computed();
  test_masks();
  test_gqa();
  test_empty();
  test_layer();
  test_kv_cache();
  test_backward();
  test_layer_backward();
  test_output_overlap();
  test_errors();
  test_struct_sizes();
  test_dropout();
  test_read_npy(directory);
  test_thread_local_message();
  printf("capi_test: all checks passed\n");
  return 0;
}
