/* What the C API test's files share: checks that print file:line and exit 1, tensors, the
 * float64 loop results are compared with, and the inputs. Outputs are float32 unless stated;
 * float32 rounding of values of magnitude <= 4 is below 1e-6, so kTol = 1e-6 is the tolerance
 * throughout. */
#ifndef QKV_TESTS_CAPI_CAPI_CHECK_H_
#define QKV_TESTS_CAPI_CAPI_CHECK_H_

#include <math.h>
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

static inline qkv_tensor make_tensor(void* data, qkv_dtype dtype, int32_t rank,
                                     const int64_t* shape, const char* name) {
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
static inline void naive_head(const float* q, const float* k, const float* v, int nq, int nk,
                              int d, int dv, double scale, int causal, const unsigned char* mask,
                              double* out, double* lse) {
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

/* Three queries, three keys (D = 2, Dv = 2). */
static const float kQ3[] = {0.5f, -1.0f, 1.5f, 0.25f, -0.75f, 2.0f};
static const float kK3[] = {1.0f, 0.5f, -0.5f, 1.0f, 2.0f, -1.0f};
static const float kV3[] = {1.0f, -2.0f, 0.5f, 3.0f, -1.5f, 0.25f};
static const int64_t kShape3[] = {3, 2};

/* capi_layer_cache_test.c */
void test_layer(void);
void test_kv_cache(void);
void test_read_npy(const char* directory);
/* capi_backward_test.c */
void test_backward(void);
void test_output_overlap(void);
/* capi_layer_backward_test.c */
void test_layer_backward(void);

#endif /* QKV_TESTS_CAPI_CAPI_CHECK_H_ */
