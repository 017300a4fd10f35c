// The projection weights `qkv layer` and `qkv explain` both take, read by one piece of code so
// that explain sees exactly the layer the layer command runs.
//
// Weights may come from model files (FILE.safetensors:NAME) in the layouts checkpoints use:
// --linear-layout says the stored matrices are nn.Linear weights [out, in] (BERT, PyTorch), to
// be transposed on load; --wqkv gives a fused [d, (H + 2·Hkv)·dk] projection (GPT-2's c_attn)
// that is split into W^Q, W^K and W^V as column blocks, without a copy (and --bqkv its bias).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qkv/layer.h"
#include "qkv/tensor.h"

namespace qkv::cli {

struct WeightFlags {
  std::string wq, wk, wv, wo, wqkv;
  std::string bq, bk, bv, bo, bqkv;
  std::int64_t heads = 1;
  std::int64_t kv_heads = 0;  // 0: as many as heads
  bool linear_layout = false;
  CLI::Option* heads_option = nullptr;
};

// Adds --wq --wk --wv --wqkv --wo, the biases, --heads, --kv-heads and --linear-layout.
// --heads is marked required when `heads_required` (qkv layer); qkv explain, which also takes
// Q, K, V files, asks for it itself when the weights are given.
void add_weight_flags(CLI::App& command, WeightFlags& flags, bool heads_required);

// Whether any weight flag was given.
bool any_weight(const WeightFlags& flags);

// Every tensor file the flags name (empty ones included), for check_input_sizes.
std::vector<std::string> weight_specs(const WeightFlags& flags);

// The weights read, and the layer's views of them. Not copyable or movable: the views point
// into the tensors.
struct LoadedWeights {
  std::optional<Tensor> wqkv, wq, wk, wv, wo;
  std::optional<Tensor> bqkv, bq, bk, bv, bo;
  LayerWeights weights;

  LoadedWeights() = default;
  LoadedWeights(const LoadedWeights&) = delete;
  LoadedWeights& operator=(const LoadedWeights&) = delete;
};

// Refuses weight flags that do not go together (--wqkv or all of --wq, --wk, --wv; --bqkv or
// the separate biases; --bo needs --wo), before anything is read.
void check_weight_flags(const WeightFlags& flags);

// Checks that the flags go together (--wqkv or all of --wq, --wk, --wv; --bqkv or the separate
// biases; --bo needs --wo), reads every file and splits fused ones. Errors name the flag or file.
void load_weights(const WeightFlags& flags, LoadedWeights& out);

}  // namespace qkv::cli
