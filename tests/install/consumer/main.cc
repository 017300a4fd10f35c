// Uses the installed library: one attention call, printed.
#include <qkv/qkv.h>

#include <cstdio>

int main() {
  const float q[] = {1, 0};
  const float k[] = {1, 0, 0, 1};
  const float v[] = {1, 2, 3, 4};
  const qkv::TensorView qv{q, qkv::DType::kF32, {1, 2}, {2, 1}, "q"};
  const qkv::TensorView kv{k, qkv::DType::kF32, {2, 2}, {2, 1}, "k"};
  const qkv::TensorView vv{v, qkv::DType::kF32, {2, 2}, {2, 1}, "v"};
  qkv::AttentionOptions options;
  options.scale = 1.0;
  const qkv::AttentionResult r = qkv::attention(qv, kv, vv, options);
  std::printf("qkv %s: %.6f %.6f\n", qkv::version(), r.out.data_as<float>()[0],
              r.out.data_as<float>()[1]);
  return 0;
}
