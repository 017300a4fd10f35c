/* The C API's layer, KV cache and .npy reader against the float64 loop and plain attention. */
#include "capi_check.h"

/* The layer with identity projections is attention of X itself; with two heads of width 1 each
 * head is attention of one column (scale 1/sqrt(1)); W^O = I with a bias adds the bias. */
void test_layer(void) {
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
void test_kv_cache(void) {
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

/* qkv_read_npy: a file written here by hand (version 1.0, <f4, shape (2, 3)), a missing file
 * and a truncated one. */
void test_read_npy(const char* directory) {
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
