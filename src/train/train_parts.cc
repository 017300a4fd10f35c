#include "train_parts.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace qkv::train {

std::uint32_t Rng::below(std::uint32_t n) {
  // Rejection sampling on 64-bit draws: accept below the largest multiple of n.
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  std::uint64_t r;
  do {
    r = engine_();
  } while (r >= limit);
  return static_cast<std::uint32_t>(r % n);
}

float Rng::uniform() { return static_cast<float>(engine_() >> 40) * 0x1.0p-24f; }

float Rng::normal() {
  // Box-Muller in double; u1 in (0, 1] keeps the log finite.
  const double u1 = (static_cast<double>(engine_() >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                            std::cos(2.0 * std::numbers::pi * u2));
}

int sequence_length(const TaskConfig& c) {
  if (c.task == Task::kRecall) return c.pairs + c.queries;
  return c.seq_len > 0 ? c.seq_len : 2 * c.pairs + c.queries;
}

Sequence make_sequence(const TaskConfig& c, Rng& rng) {
  // Distinct keys: a partial Fisher-Yates shuffle of 0..vocab-1.
  std::vector<int> keys(static_cast<std::size_t>(c.vocab));
  for (int i = 0; i < c.vocab; ++i) keys[static_cast<std::size_t>(i)] = i;
  for (int i = 0; i < c.pairs; ++i) {
    const auto j = static_cast<std::size_t>(i) +
                   rng.below(static_cast<std::uint32_t>(c.vocab - i));
    std::swap(keys[static_cast<std::size_t>(i)], keys[j]);
  }
  std::vector<int> values(static_cast<std::size_t>(c.pairs));
  for (auto& v : values) v = static_cast<int>(rng.below(static_cast<std::uint32_t>(c.vocab)));

  Sequence s;
  const int n = sequence_length(c);
  s.key.assign(static_cast<std::size_t>(n), -1);
  s.value.assign(static_cast<std::size_t>(n), -1);
  s.target.assign(static_cast<std::size_t>(n), -1);
  int t = 0;
  for (int i = 0; i < c.pairs; ++i) {
    const auto ui = static_cast<std::size_t>(i);
    if (c.task == Task::kRecall) {
      s.key[static_cast<std::size_t>(t)] = keys[ui];
      s.value[static_cast<std::size_t>(t)] = values[ui];
      ++t;
    } else {
      s.key[static_cast<std::size_t>(t++)] = keys[ui];
      s.key[static_cast<std::size_t>(t++)] = c.vocab + values[ui];
    }
  }
  for (; t < n; ++t) {
    const auto q = static_cast<std::size_t>(rng.below(static_cast<std::uint32_t>(c.pairs)));
    s.key[static_cast<std::size_t>(t)] = keys[q];
    s.target[static_cast<std::size_t>(t)] = values[q];
  }
  return s;
}

std::vector<float> init_normal(std::size_t n, float scale, Rng& rng) {
  std::vector<float> out(n);
  for (auto& x : out) x = scale * rng.normal();
  return out;
}

void embed(const Sequence& s, Task task, const std::vector<float>& a, const std::vector<float>& b,
           int d, float* x) {
  const auto ud = static_cast<std::size_t>(d);
  for (int t = 0; t < s.length(); ++t) {
    const auto ut = static_cast<std::size_t>(t);
    float* row = x + ut * ud;
    const float* ra = a.data() + static_cast<std::size_t>(s.key[ut]) * ud;
    const int second = task == Task::kRecall ? s.value[ut] : t;
    for (std::size_t j = 0; j < ud; ++j) row[j] = ra[j];
    if (second >= 0) {
      const float* rb = b.data() + static_cast<std::size_t>(second) * ud;
      for (std::size_t j = 0; j < ud; ++j) row[j] += rb[j];
    }
  }
}

void embed_backward(const Sequence& s, Task task, const float* dx, int d,
                    std::vector<float>& ga, std::vector<float>& gb) {
  const auto ud = static_cast<std::size_t>(d);
  for (int t = 0; t < s.length(); ++t) {
    const auto ut = static_cast<std::size_t>(t);
    const float* row = dx + ut * ud;
    float* ra = ga.data() + static_cast<std::size_t>(s.key[ut]) * ud;
    for (std::size_t j = 0; j < ud; ++j) ra[j] += row[j];
    const int second = task == Task::kRecall ? s.value[ut] : t;
    if (second >= 0) {
      float* rb = gb.data() + static_cast<std::size_t>(second) * ud;
      for (std::size_t j = 0; j < ud; ++j) rb[j] += row[j];
    }
  }
}

double readout_loss(const Sequence& s, const float* y, int d, int classes,
                    const std::vector<float>& w, const std::vector<float>& b, float grad_scale,
                    float* dy, std::vector<float>* dw, std::vector<float>* db, int* count,
                    int* correct) {
  const auto ud = static_cast<std::size_t>(d);
  const auto uc = static_cast<std::size_t>(classes);
  std::vector<double> logits(uc);
  std::vector<float> dlogit(uc);
  double loss = 0.0;
  if (dy != nullptr) std::fill(dy, dy + static_cast<std::size_t>(s.length()) * ud, 0.0f);
  for (int t = 0; t < s.length(); ++t) {
    const auto ut = static_cast<std::size_t>(t);
    const int target = s.target[ut];
    if (target < 0) continue;
    const float* row = y + ut * ud;
    for (std::size_t c = 0; c < uc; ++c) logits[c] = b[c];
    for (std::size_t j = 0; j < ud; ++j)
      for (std::size_t c = 0; c < uc; ++c) logits[c] += double{row[j]} * double{w[j * uc + c]};
    std::size_t best = 0;
    for (std::size_t c = 1; c < uc; ++c)
      if (logits[c] > logits[best]) best = c;
    const double mx = logits[best];
    double sum = 0.0;
    for (std::size_t c = 0; c < uc; ++c) sum += std::exp(logits[c] - mx);
    const double lse = mx + std::log(sum);
    loss += lse - logits[static_cast<std::size_t>(target)];
    ++*count;
    if (best == static_cast<std::size_t>(target)) ++*correct;
    if (dy == nullptr) continue;
    for (std::size_t c = 0; c < uc; ++c) {
      const double p = std::exp(logits[c] - lse);
      dlogit[c] = static_cast<float>((p - (c == static_cast<std::size_t>(target) ? 1.0 : 0.0)) *
                                     double{grad_scale});
    }
    float* drow = dy + ut * ud;
    for (std::size_t j = 0; j < ud; ++j) {
      float acc = 0.0f;
      for (std::size_t c = 0; c < uc; ++c) {
        acc += w[j * uc + c] * dlogit[c];
        (*dw)[j * uc + c] += row[j] * dlogit[c];
      }
      drow[j] = acc;
    }
    for (std::size_t c = 0; c < uc; ++c) (*db)[c] += dlogit[c];
  }
  return loss;
}

void AdamState::update(std::vector<float>& p, const std::vector<float>& g, const AdamConfig& c,
                       int step) {
  const float bc1 = 1.0f - std::pow(c.beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(c.beta2, static_cast<float>(step));
  for (std::size_t i = 0; i < p.size(); ++i) {
    m_[i] = c.beta1 * m_[i] + (1.0f - c.beta1) * g[i];
    v_[i] = c.beta2 * v_[i] + (1.0f - c.beta2) * g[i] * g[i];
    const float mhat = m_[i] / bc1;
    const float vhat = v_[i] / bc2;
    p[i] -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
  }
}

}  // namespace qkv::train
