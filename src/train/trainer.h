// `qkv train`: a small attention model learns retrieval on qkv's own forward and backward.
//   x_0[t]     = embedding of token t (recall: E_key[k] + E_val[v]; mqar: E_tok[id] + E_pos[t])
//   x_{l+1}    = x_l + multi_head_attention(x_l, W_l)      (causal; residual around each layer)
//   logits[t]  = x_L[t]·R + r,   loss = mean cross-entropy over the query positions
// Causal because a query should retrieve only from what came before it (the pairs), as in a
// language model, and because mqar's first layer must see only the previous token to bind a
// value to its key. Adam (float32, bias-corrected) updates every parameter; all randomness comes
// from three streams of one seed (initialisation, training sequences, held-out sequences), so a
// run is bitwise reproducible and independent of the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tensor.h"
#include "train/train_parts.h"

namespace qkv::train {

struct TrainConfig {
  TaskConfig task;
  int layers = 1;
  int d_model = 64;
  int heads = 1;
  int steps = 600;
  int batch = 32;        // sequences per step
  AdamConfig adam;
  std::uint64_t seed = 1;
  int threads = 0;
  int eval_every = 50;   // steps between held-out evaluations
  int heldout = 256;     // held-out sequences
  // Attention dropout while training (not in evaluation): step s draws its masks with a seed
  // from (seed, s) and layer l's with dropout offset l, the backward drawing them again.
  double dropout = 0.0;
  // The attention's computation: kF32, or kBF16 (the attention's forward and backward in bf16:
  // bf16 dot products with float32 sums and softmax; the projections, the weights, their
  // gradients and Adam stay float32).
  DType attention_dtype = DType::kF32;
};

struct CurvePoint {
  int step = 0;
  double loss = 0.0;              // mean training loss over the steps since the last point
  double heldout_accuracy = 0.0;  // 0..1
  double steps_per_second = 0.0;
};

struct Model {
  int vocab_a = 0, vocab_b = 0, d = 0, classes = 0;
  std::vector<float> table_a, table_b;          // [vocab_a, d], [vocab_b, d]
  std::vector<std::vector<float>> wq, wk, wv, wo;  // per layer, each [d, d] (X·W)
  std::vector<float> readout, readout_bias;     // [d, classes], [classes]
};

struct TrainResult {
  Model model;
  std::vector<CurvePoint> curve;
  double heldout_accuracy = 0.0;
  double loss = 0.0;
  double seconds = 0.0;
};

// Throws qkv::Error naming the option on an impossible configuration.
void validate(const TrainConfig& config);

// What a training run holds at its peak, estimated from the configuration alone before
// anything is allocated (saturating at 2^64 - 1): the parameters with their Adam moments and
// gradients, and the copy --out encodes; the step's activations (each layer's input, the
// readout's gradient, each layer's saved Q, K, V, heads and lse); and the largest single layer
// call, forward or backward, with its kernels' workspace.
struct TrainMemory {
  std::uint64_t parameters = 0;
  std::uint64_t activations = 0;
  std::uint64_t layer_call = 0;
  std::uint64_t total() const noexcept;
};
TrainMemory train_memory(const TrainConfig& config);

// `progress` (may be empty) is called after every evaluation.
TrainResult train(const TrainConfig& config,
                  const std::function<void(const CurvePoint&)>& progress = {});

// Held-out accuracy of `model` on `count` sequences from the held-out stream of `seed`.
double evaluate(const Model& model, const TrainConfig& config, int count);

// The model's tensors by the names --out writes: "embed.a", "embed.b", "layer{l}.wq" .. ".wo",
// "readout.w", "readout.b".
std::vector<std::pair<std::string, Tensor>> model_tensors(const Model& model);

// Label of position t of a sequence: recall "k3:v7" / "?k3"; mqar "k3", "v7", "?k3".
std::string token_label(const Sequence& s, Task task, int vocab, int t);

// The first held-out sequence of `seed` (what --html explains).
Sequence heldout_sequence(const TrainConfig& config, int index);

// The layer input x_l [N, d] of layer `layer` for sequence `s`.
std::vector<float> layer_input(const Model& model, const TrainConfig& config, const Sequence& s,
                               int layer);

}  // namespace qkv::train
