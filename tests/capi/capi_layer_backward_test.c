/* qkv_layer_backward from C: every gradient of a float64 layer (grouped-query heads, causal,
 * biases and W^O; self- and cross-attention; without and with attention dropout, its mask fixed
 * by the seed) against central finite differences of qkv_multi_head_attention itself, float32
 * gradients bitwise the same on 1, 2 and 3 threads, the layer's dropout (p = 0 is no dropout,
 * bit for bit; kept weights scaled by 1/(1 - p)), and the refusals. */
#include "capi_check.h"

enum { kB = 2, kN = 3, kD = 4, kNm = 4, kDm = 3, kH = 2, kHkv = 1, kDk = 2, kDv = 3, kDout = 5 };

/* The arrays of one layer call, float64: x, memory and the eight weights in this order. */
enum { kX, kMemory, kWq, kWk, kWv, kWo, kBq, kBk, kBv, kBo, kArrays };

typedef struct Layer {
  double* data[kArrays];
  int64_t shape[kArrays][3];
  int32_t rank[kArrays];
  int with_memory;
} Layer;

static double next_value(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(*state >> 11) / 9007199254740992.0 - 0.5; /* [-0.5, 0.5) */
}

static int64_t numel(const Layer* l, int a) {
  int64_t n = 1;
  int i;
  for (i = 0; i < l->rank[a]; ++i) n *= l->shape[a][i];
  return n;
}

static void set_shape(Layer* l, int a, int32_t rank, int64_t d0, int64_t d1, int64_t d2) {
  l->rank[a] = rank;
  l->shape[a][0] = d0;
  l->shape[a][1] = d1;
  l->shape[a][2] = d2;
}

static void make_layer(Layer* l, int with_memory, uint64_t seed) {
  const int64_t source = with_memory ? kDm : kD;
  int a;
  int64_t e;
  memset(l, 0, sizeof *l);
  l->with_memory = with_memory;
  set_shape(l, kX, 3, kB, kN, kD);
  set_shape(l, kMemory, with_memory ? 3 : 0, kB, kNm, kDm);
  set_shape(l, kWq, 2, kD, kH * kDk, 0);
  set_shape(l, kWk, 2, source, kHkv * kDk, 0);
  set_shape(l, kWv, 2, source, kHkv * kDv, 0);
  set_shape(l, kWo, 2, kH * kDv, kDout, 0);
  set_shape(l, kBq, 1, kH * kDk, 0, 0);
  set_shape(l, kBk, 1, kHkv * kDk, 0, 0);
  set_shape(l, kBv, 1, kHkv * kDv, 0, 0);
  set_shape(l, kBo, 1, kDout, 0, 0);
  for (a = 0; a < kArrays; ++a) {
    if (l->rank[a] == 0) continue;
    l->data[a] = (double*)malloc(sizeof(double) * (size_t)numel(l, a));
    CHECK(l->data[a] != NULL);
    for (e = 0; e < numel(l, a); ++e) l->data[a][e] = 2.0 * next_value(&seed);
  }
}

static void free_layer(Layer* l) {
  int a;
  for (a = 0; a < kArrays; ++a) free(l->data[a]);
}

/* The tensors of the layer's arrays as `dtype` (F64: the arrays themselves; F32: copies in
 * `f32`, which the caller frees). */
typedef struct Call {
  qkv_tensor t[kArrays];
  qkv_layer_weights weights;
  qkv_layer_options options;
  qkv_attention_options attention;
  float* f32[kArrays];
} Call;

/* `dropout`: the attention's dropout_p, with a fixed seed and offset. */
static void make_call(Call* c, const Layer* l, qkv_dtype dtype, int threads, double dropout) {
  static const char* const kNames[kArrays] = {"x",  "memory", "wq", "wk", "wv",
                                              "wo", "bq",     "bk", "bv", "bo"};
  int a;
  int64_t e;
  memset(c, 0, sizeof *c);
  for (a = 0; a < kArrays; ++a) {
    void* data = l->data[a];
    if (l->rank[a] == 0) continue;
    if (dtype == QKV_F32) {
      c->f32[a] = (float*)malloc(sizeof(float) * (size_t)numel(l, a));
      CHECK(c->f32[a] != NULL);
      for (e = 0; e < numel(l, a); ++e) c->f32[a][e] = (float)l->data[a][e];
      data = c->f32[a];
    }
    c->t[a] = make_tensor(data, dtype, l->rank[a], l->shape[a], kNames[a]);
  }
  qkv_layer_weights_init(&c->weights);
  c->weights.wq = &c->t[kWq];
  c->weights.wk = &c->t[kWk];
  c->weights.wv = &c->t[kWv];
  c->weights.wo = &c->t[kWo];
  c->weights.bq = &c->t[kBq];
  c->weights.bk = &c->t[kBk];
  c->weights.bv = &c->t[kBv];
  c->weights.bo = &c->t[kBo];
  qkv_attention_options_init(&c->attention);
  c->attention.causal = 1;
  c->attention.threads = threads;
  c->attention.out_dtype = dtype;
  c->attention.dropout_p = dropout;
  c->attention.seed = 0xfedcba9876543210ULL;
  c->attention.dropout_offset = 11;
  qkv_layer_options_init(&c->options);
  c->options.heads = kH;
  c->options.kv_heads = kHkv;
  c->options.attention = &c->attention;
}

static void free_call(Call* c) {
  int a;
  for (a = 0; a < kArrays; ++a) free(c->f32[a]);
}

/* sum(out * grad_out) of the float64 layer as it stands. */
static double loss(const Layer* l, const double* grad_out, double dropout) {
  Call c;
  qkv_result* r = NULL;
  qkv_tensor out;
  double sum = 0.0;
  int e;
  make_call(&c, l, QKV_F64, 1, dropout);
  CHECK_OK(qkv_multi_head_attention(&c.t[kX], &c.weights, &c.options,
                                    l->with_memory ? &c.t[kMemory] : NULL, &r));
  memset(&out, 0, sizeof out);
  out.struct_size = sizeof out;
  CHECK_OK(qkv_result_tensor(r, QKV_RESULT_OUT, &out));
  CHECK(out.dtype == QKV_F64 && out.rank == 3 && out.shape[2] == kDout);
  for (e = 0; e < kB * kN * kDout; ++e) sum += ((const double*)out.data)[e] * grad_out[e];
  qkv_result_free(r);
  free_call(&c);
  return sum;
}

static void check_against_finite_differences(int with_memory, double dropout) {
  static const qkv_result_part kParts[kArrays] = {
      QKV_RESULT_DX,  QKV_RESULT_DMEMORY, QKV_RESULT_DWQ, QKV_RESULT_DWK, QKV_RESULT_DWV,
      QKV_RESULT_DWO, QKV_RESULT_DBQ,     QKV_RESULT_DBK, QKV_RESULT_DBV, QKV_RESULT_DBO};
  const int64_t grad_shape[] = {kB, kN, kDout};
  const double eps = 1e-6;
  double grad_out[kB * kN * kDout];
  uint64_t seed = 99;
  Layer l;
  Call c;
  qkv_result* g = NULL;
  qkv_tensor dy, view;
  int a, e;

  make_layer(&l, with_memory, with_memory ? 11 : 7);
  for (e = 0; e < kB * kN * kDout; ++e) grad_out[e] = next_value(&seed);
  make_call(&c, &l, QKV_F64, 0, dropout);
  dy = make_tensor(grad_out, QKV_F64, 3, grad_shape, "grad_out");
  /* The mask dropped something: this is not the case without dropout. */
  if (dropout > 0.0) CHECK(fabs(loss(&l, grad_out, dropout) - loss(&l, grad_out, 0.0)) > 1e-3);
  CHECK_OK(qkv_layer_backward(&c.t[kX], &c.weights, &c.options, with_memory ? &c.t[kMemory] : NULL,
                              &dy, &g));
  CHECK(qkv_result_kernel(g)[0] != '\0');
  memset(&view, 0, sizeof view);
  view.struct_size = sizeof view;
  for (a = 0; a < kArrays; ++a) {
    if (l.rank[a] == 0) {
      CHECK_ERROR(qkv_result_tensor(g, kParts[a], &view), QKV_ERROR_INVALID_ARGUMENT,
                  "dmemory: is not in this result");
      continue;
    }
    CHECK_OK(qkv_result_tensor(g, kParts[a], &view));
    CHECK(view.dtype == QKV_F64 && view.rank == l.rank[a]);
    CHECK(memcmp(view.shape, l.shape[a], sizeof(int64_t) * (size_t)l.rank[a]) == 0);
    for (e = 0; e < numel(&l, a); ++e) {
      const double kept = l.data[a][e];
      double up, down, want;
      l.data[a][e] = kept + eps;
      up = loss(&l, grad_out, dropout);
      l.data[a][e] = kept - eps;
      down = loss(&l, grad_out, dropout);
      l.data[a][e] = kept;
      want = (up - down) / (2 * eps);
      if (!(fabs(((const double*)view.data)[e] - want) <= 1e-6 * (1.0 + fabs(want)))) {
        fprintf(stderr, "%s:%d: %s[%d] = %.12g, finite differences %.12g\n", __FILE__,
                __LINE__, view.name, e, ((const double*)view.data)[e], want);
        exit(1);
      }
    }
  }
  CHECK_ERROR(qkv_result_tensor(g, QKV_RESULT_DSINKS, &view), QKV_ERROR_INVALID_ARGUMENT,
              "dsinks: is not in this result");
  qkv_result_free(g);
  free_call(&c);
  free_layer(&l);
}

/* float32 gradients on 1, 2 and 3 threads: the same bytes. */
static void check_threads_bitwise(double dropout) {
  const int64_t grad_shape[] = {kB, kN, kDout};
  float grad_out[kB * kN * kDout];
  uint64_t seed = 5;
  Layer l;
  qkv_result* first = NULL;
  int threads, part, e;

  make_layer(&l, 0, 3);
  for (e = 0; e < kB * kN * kDout; ++e) grad_out[e] = (float)next_value(&seed);
  for (threads = 1; threads <= 3; ++threads) {
    Call c;
    qkv_result* g = NULL;
    qkv_tensor dy = make_tensor(grad_out, QKV_F32, 3, grad_shape, "grad_out");
    make_call(&c, &l, QKV_F32, threads, dropout);
    CHECK_OK(qkv_layer_backward(&c.t[kX], &c.weights, &c.options, NULL, &dy, &g));
    for (part = QKV_RESULT_DX; part <= QKV_RESULT_DBO; ++part) {
      qkv_tensor a, b;
      size_t bytes = 4;
      int32_t i;
      if (part == QKV_RESULT_DMEMORY) continue;
      memset(&a, 0, sizeof a);
      a.struct_size = sizeof a;
      b = a;
      CHECK_OK(qkv_result_tensor(g, (qkv_result_part)part, &a));
      CHECK(a.dtype == QKV_F32);
      if (first == NULL) continue;
      CHECK_OK(qkv_result_tensor(first, (qkv_result_part)part, &b));
      for (i = 0; i < a.rank; ++i) bytes *= (size_t)a.shape[i];
      CHECK(a.rank == b.rank && memcmp(a.data, b.data, bytes) == 0);
    }
    free_call(&c);
    if (first == NULL) {
      first = g;
    } else {
      qkv_result_free(g);
    }
  }
  qkv_result_free(first);
  free_layer(&l);
}

static void check_refusals(void) {
  const int64_t bad_shape[] = {kB, kN, kDout + 1};
  float grad_out[kB * kN * (kDout + 1)];
  Layer l;
  Call c;
  qkv_result* r = (qkv_result*)&l; /* a sentinel: a failed call must not write *result */
  qkv_tensor dy;
  memset(grad_out, 0, sizeof grad_out);
  make_layer(&l, 0, 1);
  make_call(&c, &l, QKV_F32, 1, 0.0);
  dy = make_tensor(grad_out, QKV_F32, 3, bad_shape, "grad_out");
  CHECK_ERROR(qkv_layer_backward(&c.t[kX], &c.weights, &c.options, NULL, &dy, &r),
              QKV_ERROR_INVALID_ARGUMENT, "grad_out: shape [2, 3, 6] should be [2, 3, 5]");
  CHECK(r == (qkv_result*)&l);
  CHECK_ERROR(qkv_layer_backward(&c.t[kX], &c.weights, &c.options, NULL, NULL, &r),
              QKV_ERROR_INVALID_ARGUMENT, "grad_out: must not be NULL");
  CHECK_ERROR(qkv_layer_backward(&c.t[kX], &c.weights, &c.options, NULL, &dy, NULL),
              QKV_ERROR_INVALID_ARGUMENT, "result: must not be NULL");
  c.attention.kernel = "no_such_kernel";
  dy.shape = c.t[kX].shape; /* any shape: the kernel is refused first */
  CHECK_ERROR(qkv_layer_backward(&c.t[kX], &c.weights, &c.options, NULL, &dy, &r),
              QKV_ERROR_INVALID_ARGUMENT, "no_such_kernel");
  CHECK(r == (qkv_result*)&l);
  c.attention.kernel = NULL;
  c.attention.dropout_p = 1.0;
  CHECK_ERROR(qkv_multi_head_attention(&c.t[kX], &c.weights, &c.options, NULL, &r),
              QKV_ERROR_INVALID_ARGUMENT, "dropout_p: must be in [0, 1)");
  CHECK_ERROR(qkv_layer_backward(&c.t[kX], &c.weights, &c.options, NULL, &dy, &r),
              QKV_ERROR_INVALID_ARGUMENT, "dropout_p: must be in [0, 1)");
  CHECK(r == (qkv_result*)&l);
  free_call(&c);
  free_layer(&l);
}

/* The layer's forward with dropout: p = 0 (any seed) is the call without it, bit for bit; with
 * p = 0.5 each head's weight is 0 or twice the weight without dropout, some of each. */
static void check_dropout_forward(void) {
  Layer l;
  Call c;
  qkv_result *plain = NULL, *zero = NULL, *half = NULL;
  qkv_tensor a, b;
  int e, kept = 0, dropped = 0;
  make_layer(&l, 0, 21);
  make_call(&c, &l, QKV_F64, 2, 0.0);
  c.attention.return_weights = 1;
  c.attention.seed = 0;
  c.attention.dropout_offset = 0;
  CHECK_OK(qkv_multi_head_attention(&c.t[kX], &c.weights, &c.options, NULL, &plain));
  c.attention.seed = 77;
  c.attention.dropout_offset = 3;
  CHECK_OK(qkv_multi_head_attention(&c.t[kX], &c.weights, &c.options, NULL, &zero));
  c.attention.dropout_p = 0.5;
  CHECK_OK(qkv_multi_head_attention(&c.t[kX], &c.weights, &c.options, NULL, &half));
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  b = a;
  CHECK_OK(qkv_result_tensor(plain, QKV_RESULT_OUT, &a));
  CHECK_OK(qkv_result_tensor(zero, QKV_RESULT_OUT, &b));
  CHECK(memcmp(a.data, b.data, sizeof(double) * kB * kN * kDout) == 0);
  CHECK_OK(qkv_result_tensor(plain, QKV_RESULT_WEIGHTS, &a));
  CHECK_OK(qkv_result_tensor(half, QKV_RESULT_WEIGHTS, &b));
  CHECK(b.rank == 4 && b.shape[1] == kH && b.shape[3] == kN);
  for (e = 0; e < kB * kH * kN * kN; ++e) {
    const double w0 = ((const double*)a.data)[e], w = ((const double*)b.data)[e];
    if (w0 == 0.0) continue;
    if (w == 0.0) {
      ++dropped;
    } else {
      CHECK(fabs(w - 2.0 * w0) <= 1e-15);
      ++kept;
    }
  }
  CHECK(kept > 0 && dropped > 0);
  qkv_result_free(plain);
  qkv_result_free(zero);
  qkv_result_free(half);
  free_call(&c);
  free_layer(&l);
}

void test_layer_backward(void) {
  check_against_finite_differences(0, 0.0);
  check_against_finite_differences(1, 0.0);
  check_against_finite_differences(0, 0.5);
  check_against_finite_differences(1, 0.5);
  check_threads_bitwise(0.0);
  check_threads_bitwise(0.5);
  check_dropout_forward();
  check_refusals();
}
