/* qkv_attention_backward from C: the gradients of three queries against three keys held to a
 * float64 statement of the formulas written here, the sinks' gradient, and the refusals. */
#include "capi_check.h"

/* dQ, dK, dV (and d sink) of sum(out * dout) for one head, from the formulas: P the softmax
 * weights (a sink's logit in the denominator when `sink` is finite), D_i = dO_i·O_i,
 * dS_ij = P_ij (dO_i·v_j - D_i), dQ = scale·dS·K, dK = scale·dSᵀ·Q, dV = Pᵀ·dO. */
static void naive_gradients(const float* q, const float* k, const float* v, const float* dout,
                            int n, int d, double scale, double sink, double* dq, double* dk,
                            double* dv, double* dsink) {
  int i, j, c;
  memset(dq, 0, sizeof(double) * (size_t)(n * d));
  memset(dk, 0, sizeof(double) * (size_t)(n * d));
  memset(dv, 0, sizeof(double) * (size_t)(n * d));
  *dsink = 0.0;
  for (i = 0; i < n; ++i) {
    double s[8], p[8], o[8], max = sink, sum = 0.0, di = 0.0;
    for (j = 0; j < n; ++j) {
      double dot = 0.0;
      for (c = 0; c < d; ++c) dot += (double)q[i * d + c] * k[j * d + c];
      s[j] = scale * dot;
      if (s[j] > max) max = s[j];
    }
    sum = isinf(sink) ? 0.0 : exp(sink - max);
    for (j = 0; j < n; ++j) sum += exp(s[j] - max);
    for (j = 0; j < n; ++j) p[j] = exp(s[j] - max) / sum;
    for (c = 0; c < d; ++c) {
      o[c] = 0.0;
      for (j = 0; j < n; ++j) o[c] += p[j] * v[j * d + c];
      di += dout[i * d + c] * o[c];
    }
    if (!isinf(sink)) *dsink -= exp(sink - max) / sum * di;
    for (j = 0; j < n; ++j) {
      double dp = 0.0, ds;
      for (c = 0; c < d; ++c) dp += dout[i * d + c] * v[j * d + c];
      ds = p[j] * (dp - di);
      for (c = 0; c < d; ++c) {
        dq[i * d + c] += scale * ds * k[j * d + c];
        dk[j * d + c] += scale * ds * q[i * d + c];
        dv[j * d + c] += p[j] * dout[i * d + c];
      }
    }
  }
}

static void check_part(const qkv_result* r, qkv_result_part part, const double* want, int n) {
  qkv_tensor view;
  int e;
  view.struct_size = sizeof view;
  CHECK_OK(qkv_result_tensor(r, part, &view));
  CHECK(view.dtype == QKV_F32);
  for (e = 0; e < n; ++e) CHECK_NEAR(((const float*)view.data)[e], want[e]);
}

void test_backward(void) {
  static const float kDout[] = {0.3f, -1.0f, 2.0f, 0.5f, -0.25f, 1.5f};
  static const float kSinks[] = {0.7f};
  static const int64_t kShapeH[] = {1};
  const double scale = 1.0 / sqrt(2.0);
  double dq[6], dk[6], dv[6], dsink;
  qkv_tensor q = make_tensor((void*)kQ3, QKV_F32, 2, kShape3, "q");
  qkv_tensor k = make_tensor((void*)kK3, QKV_F32, 2, kShape3, "k");
  qkv_tensor v = make_tensor((void*)kV3, QKV_F32, 2, kShape3, "v");
  qkv_tensor dout = make_tensor((void*)kDout, QKV_F32, 2, kShape3, "dO");
  qkv_tensor sinks = make_tensor((void*)kSinks, QKV_F32, 1, kShapeH, "sinks");
  qkv_tensor out, lse, bad;
  qkv_attention_options options;
  qkv_result *forward = NULL, *grads = NULL;
  int with_sinks;

  for (with_sinks = 0; with_sinks < 2; ++with_sinks) {
    qkv_attention_options_init(&options);
    options.return_lse = 1;
    if (with_sinks) options.sinks = &sinks;
    CHECK_OK(qkv_attention(&q, &k, &v, &options, &forward));
    out.struct_size = lse.struct_size = sizeof out;
    CHECK_OK(qkv_result_tensor(forward, QKV_RESULT_OUT, &out));
    CHECK_OK(qkv_result_tensor(forward, QKV_RESULT_LSE, &lse));
    CHECK_OK(qkv_attention_backward(&q, &k, &v, &out, &lse, &dout, &options, &grads));
    naive_gradients(kQ3, kK3, kV3, kDout, 3, 2, scale, with_sinks ? 0.7 : -INFINITY, dq, dk, dv,
                    &dsink);
    check_part(grads, QKV_RESULT_DQ, dq, 6);
    check_part(grads, QKV_RESULT_DK, dk, 6);
    check_part(grads, QKV_RESULT_DV, dv, 6);
    if (with_sinks) {
      check_part(grads, QKV_RESULT_DSINKS, &dsink, 1);
    } else {
      qkv_tensor view;
      view.struct_size = sizeof view;
      CHECK_ERROR(qkv_result_tensor(grads, QKV_RESULT_DSINKS, &view), QKV_ERROR_INVALID_ARGUMENT,
                  "dsinks");
    }
    CHECK(strlen(qkv_result_kernel(grads)) > 0);
    qkv_result_free(grads);
    grads = NULL;

    /* bf16: bf16 gradients by default, float32 on request; both near the float32 ones. */
    options.dtype = QKV_BF16;
    CHECK_OK(qkv_attention_backward(&q, &k, &v, &out, &lse, &dout, &options, &grads));
    {
      qkv_tensor view;
      view.struct_size = sizeof view;
      CHECK_OK(qkv_result_tensor(grads, QKV_RESULT_DV, &view));
      CHECK(view.dtype == QKV_BF16);
      qkv_result_free(grads);
      grads = NULL;
      options.grad_dtype = QKV_F32;
      CHECK_OK(qkv_attention_backward(&q, &k, &v, &out, &lse, &dout, &options, &grads));
      CHECK_OK(qkv_result_tensor(grads, QKV_RESULT_DV, &view));
      CHECK(view.dtype == QKV_F32);
      for (int e = 0; e < 6; ++e) CHECK(fabs(((const float*)view.data)[e] - dv[e]) < 3e-2);
      qkv_result_free(grads);
      grads = NULL;
    }

    /* Refusals: dO of another shape, f16 storage, bf16 gradients of a float32 call; no result
     * is handed over. */
    options.dtype = QKV_DTYPE_DEFAULT;
    options.grad_dtype = QKV_DTYPE_DEFAULT;
    bad = make_tensor((void*)kDout, QKV_F32, 2, kShapeKV, "DO.npy");
    CHECK_ERROR(qkv_attention_backward(&q, &k, &v, &out, &lse, &bad, &options, &grads),
                QKV_ERROR_INVALID_ARGUMENT, "DO.npy");
    CHECK(grads == NULL);
    options.grad_dtype = QKV_BF16;
    CHECK_ERROR(qkv_attention_backward(&q, &k, &v, &out, &lse, &dout, &options, &grads),
                QKV_ERROR_INVALID_ARGUMENT, "grad_dtype");
    CHECK(grads == NULL);
    options.grad_dtype = QKV_DTYPE_DEFAULT;
    options.dtype = QKV_F16;
    CHECK_ERROR(qkv_attention_backward(&q, &k, &v, &out, &lse, &dout, &options, &grads),
                QKV_ERROR_INVALID_ARGUMENT, "dtype");
    CHECK(grads == NULL);
    qkv_result_free(forward);
    forward = NULL;
  }
}

/* qkv_attention_into with `out` inside V: refused naming both, V untouched (issue 22: it used to
 * return QKV_OK with a wrong result). Beside V in one wider buffer it is computed as usual. */
void test_output_overlap(void) {
  float wide[3 * 4];
  float before[3 * 4];
  static const int64_t kShapeWide[] = {3, 2};
  static const int64_t kStridesWide[] = {4, 1};
  double expected[6];
  int r, c;
  qkv_tensor q = make_tensor((void*)kQ3, QKV_F32, 2, kShape3, "q");
  qkv_tensor k = make_tensor((void*)kK3, QKV_F32, 2, kShape3, "k");
  qkv_tensor v, out;
  for (r = 0; r < 3; ++r) {
    for (c = 0; c < 2; ++c) wide[r * 4 + c] = kV3[r * 2 + c];
    wide[r * 4 + 2] = wide[r * 4 + 3] = 0.0f;
  }
  memcpy(before, wide, sizeof wide);
  v = make_tensor(wide, QKV_F32, 2, kShapeWide, "v");
  v.strides = kStridesWide;
  out = make_tensor(wide, QKV_F32, 2, kShapeWide, "out"); /* V's own memory */
  out.strides = kStridesWide;
  CHECK_ERROR(qkv_attention_into(&q, &k, &v, NULL, &out, NULL, NULL), QKV_ERROR_INVALID_ARGUMENT,
              "out: output memory overlaps the input v");
  CHECK(memcmp(wide, before, sizeof wide) == 0);
  /* The columns beside V: no byte shared, the answer as with separate memory. */
  out.data = wide + 2;
  CHECK_OK(qkv_attention_into(&q, &k, &v, NULL, &out, NULL, NULL));
  naive_head(kQ3, kK3, kV3, 3, 3, 2, 2, 1.0 / sqrt(2.0), 0, NULL, expected, NULL);
  for (r = 0; r < 3; ++r) {
    for (c = 0; c < 2; ++c) CHECK_NEAR(wide[r * 4 + 2 + c], expected[r * 2 + c]);
  }
}
