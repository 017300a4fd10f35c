/* Uses the installed library from C: one attention call through qkv_c.h, printed. */
#include <qkv/qkv_c.h>
#include <stdio.h>

int main(void) {
  float q[] = {1, 0}, k[] = {1, 0, 0, 1}, v[] = {1, 2, 3, 4}, out[2];
  const int64_t q_shape[] = {1, 2}, kv_shape[] = {2, 2};
  const qkv_tensor qt = {sizeof(qkv_tensor), q, QKV_F32, 2, q_shape, NULL, "q"};
  const qkv_tensor kt = {sizeof(qkv_tensor), k, QKV_F32, 2, kv_shape, NULL, "k"};
  const qkv_tensor vt = {sizeof(qkv_tensor), v, QKV_F32, 2, kv_shape, NULL, "v"};
  const qkv_tensor ot = {sizeof(qkv_tensor), out, QKV_F32, 2, q_shape, NULL, "out"};
  qkv_attention_options options;
  qkv_attention_options_init(&options);
  options.has_scale = 1;
  options.scale = 1.0;
  if (qkv_attention_into(&qt, &kt, &vt, &options, &ot, NULL, NULL) != QKV_OK) {
    fprintf(stderr, "%s\n", qkv_last_error());
    return 1;
  }
  printf("qkv %s: %.6f %.6f\n", qkv_version(), out[0], out[1]);
  return 0;
}
