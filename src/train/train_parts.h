// The parts of `qkv train` that do not need the layer's backward: the retrieval tasks (recall,
// mqar), a seeded RNG with its distributions written out (results must not depend on the standard
// library's distribution code), the embedding gather and its scatter-add gradient, the linear
// readout with softmax cross-entropy on query positions, and Adam in float32 with bias correction.
// Plain loops in a fixed order: bitwise reproducible for a given seed, whatever the thread count.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace qkv::train {

// ---- RNG: mt19937_64 bits turned into numbers by formulas written here ----
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  std::uint64_t bits() { return engine_(); }
  // Uniform in [0, n) by rejection, unbiased.
  std::uint32_t below(std::uint32_t n);
  // Uniform in [0, 1) from the top 24 bits (exact in float32).
  float uniform();
  // Standard normal by Box-Muller (both draws uniform in (0, 1]).
  float normal();

 private:
  std::mt19937_64 engine_;
};

// ---- Tasks ----
enum class Task { kRecall, kMqar };

struct TaskConfig {
  Task task = Task::kRecall;
  int vocab = 16;    // number of keys and of values
  int pairs = 8;     // (key, value) pairs per sequence
  int queries = 8;   // query positions per sequence (recall); mqar fills seq_len
  int seq_len = 0;   // mqar: total length (0 = 2·pairs + queries)
};

// One sequence as token ids plus, per position, the target value (-1 where no loss is taken).
// Token encodings:
//   recall: a pair token has key k and value v (embedding E_key[k] + E_val[v]); a query token
//           has key k and value -1 (embedding E_key[k]).
//   mqar:   a single vocabulary of 2·vocab tokens: keys 0..vocab-1, values vocab..2·vocab-1;
//           k1 v1 k2 v2 ... then query keys; the target at a query is the value after that key.
struct Sequence {
  std::vector<int> key;     // recall: key id (or -1); mqar: token id
  std::vector<int> value;   // recall: value id or -1; mqar: unused (-1)
  std::vector<int> target;  // value id to predict, -1 = no loss
  int length() const { return static_cast<int>(key.size()); }
};

// Keys in a sequence are distinct (drawn without replacement); values are drawn with replacement.
// Queries ask keys that appeared, uniformly.
Sequence make_sequence(const TaskConfig& config, Rng& rng);
int sequence_length(const TaskConfig& config);

// ---- Initialisation ----
// `n` values N(0, scale²) from `rng`, in order.
std::vector<float> init_normal(std::size_t n, float scale, Rng& rng);

// ---- Embeddings ----
// Row-major tables [rows, d]. Writes x[t, :] for the sequence (x has length·d floats).
// recall: E_key[key] + E_val[value] (value -1: key only); mqar: E_tok[key] + E_pos[t].
void embed(const Sequence& s, Task task, const std::vector<float>& table_a,
           const std::vector<float>& table_b, int d, float* x);
// The gradient: scatter-add of dx rows into the tables' gradients, positions in increasing order.
void embed_backward(const Sequence& s, Task task, const float* dx, int d,
                    std::vector<float>& grad_a, std::vector<float>& grad_b);

// ---- Readout and loss ----
// logits[t, c] = Σ_j y[t, j]·W[j, c] + b[c] for positions with a target; softmax cross-entropy.
// Returns the summed loss over target positions and adds their count to *count and the number
// predicted correctly (argmax, lowest index on ties) to *correct. When dy is not null, writes
// dL/dy scaled by `grad_scale` (rows without a target get zeros) and adds dL/dW, dL/db (scaled).
double readout_loss(const Sequence& s, const float* y, int d, int classes,
                    const std::vector<float>& w, const std::vector<float>& b, float grad_scale,
                    float* dy, std::vector<float>* dw, std::vector<float>* db, int* count,
                    int* correct);

// ---- Adam (float32, bias-corrected) ----
struct AdamConfig {
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

class AdamState {
 public:
  explicit AdamState(std::size_t n) : m_(n, 0.0f), v_(n, 0.0f) {}
  // One step on `param` with gradient `grad`; `step` counts from 1.
  void update(std::vector<float>& param, const std::vector<float>& grad, const AdamConfig& c,
              int step);

 private:
  std::vector<float> m_, v_;
};

}  // namespace qkv::train
