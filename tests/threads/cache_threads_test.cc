// qkv::KVCache from several threads at once, run under ThreadSanitizer by `make test-tsan`:
// each thread appends to, forks and removes its own sequences (the first appends copy a page
// that all of them share), reads the shared parent, and at the end finds exactly its own rows.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "cache/kv_cache_impl.h"
#include "core/half.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "support/test_support.h"

namespace qkv {
namespace {

constexpr int kThreads = 6;
constexpr int kRounds = 40;
constexpr std::int64_t kHkv = 2, kD = 5, kDv = 3, kPageRows = 4;

// One kv head's rows of K or V as the cache should return them, flattened [head][row][col].
struct Rows {
  std::vector<std::vector<double>> head{static_cast<std::size_t>(kHkv)};
};

double stored(CacheStorage storage, float x) {
  return storage == CacheStorage::kBF16 ? core::bf16_to_float(core::float_to_bf16(x)) : x;
}

void append(KVCache& cache, SequenceId seq, Rows& k_rows, Rows& v_rows, std::int64_t n,
            std::uint64_t seed) {
  const Tensor k = testing::random_tensor(DType::kF32, {kHkv, n, kD}, seed);
  const Tensor v = testing::random_tensor(DType::kF32, {kHkv, n, kDv}, seed + 1);
  cache.append(seq, k.view(), v.view());
  const CacheStorage storage = cache.options().storage;
  for (std::int64_t h = 0; h < kHkv; ++h) {
    auto& kh = k_rows.head[static_cast<std::size_t>(h)];
    auto& vh = v_rows.head[static_cast<std::size_t>(h)];
    for (std::int64_t i = 0; i < n * kD; ++i) {
      kh.push_back(stored(storage, k.data_as<float>()[h * n * kD + i]));
    }
    for (std::int64_t i = 0; i < n * kDv; ++i) {
      vh.push_back(stored(storage, v.data_as<float>()[h * n * kDv + i]));
    }
  }
}

// Empty when gather() returns exactly `k_rows` and `v_rows`; else what differs.
std::string check(const KVCache& cache, SequenceId seq, const Rows& k_rows, const Rows& v_rows) {
  for (bool values : {false, true}) {
    const Rows& rows = values ? v_rows : k_rows;
    const Tensor g = cache.gather(seq, values);
    const std::size_t per_head = rows.head[0].size();
    if (static_cast<std::size_t>(g.numel()) != per_head * kHkv) {
      return "sequence " + std::to_string(seq) + ": " + std::to_string(g.numel()) + " values";
    }
    for (std::size_t h = 0; h < kHkv; ++h) {
      for (std::size_t i = 0; i < per_head; ++i) {
        if (g.data_as<double>()[h * per_head + i] != rows.head[h][i]) {
          return "sequence " + std::to_string(seq) + (values ? " V" : " K") + " head " +
                 std::to_string(h) + " value " + std::to_string(i);
        }
      }
    }
  }
  return "";
}

class CacheThreads : public ::testing::TestWithParam<CacheStorage> {};

INSTANTIATE_TEST_SUITE_P(Storage, CacheThreads,
                         ::testing::Values(CacheStorage::kF32, CacheStorage::kBF16),
                         [](const auto& param_info) {
                           return cache_storage_name(param_info.param);
                         });

TEST_P(CacheThreads, DistinctSequencesAppendForkAndRemoveConcurrently) {
  KVCacheOptions options;
  options.storage = GetParam();
  options.kv_heads = kHkv;
  options.d = kD;
  options.dv = kDv;
  options.page_rows = kPageRows;
  KVCache cache(options);

  // The parent's last page is partly filled: every thread's first append copies it.
  const SequenceId parent = cache.add_sequence();
  Rows parent_k, parent_v;
  append(cache, parent, parent_k, parent_v, 6, 1);
  std::vector<SequenceId> forks;
  for (int t = 0; t < kThreads; ++t) forks.push_back(cache.fork(parent));

  std::vector<std::string> problems(kThreads);
  std::vector<Rows> fork_k(kThreads, parent_k), fork_v(kThreads, parent_v);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto ut = static_cast<std::size_t>(t);
      std::string& problem = problems[ut];
      try {
        std::uint64_t seed = 1000 * static_cast<std::uint64_t>(t + 1);
        const SequenceId mine = forks[ut];
        for (int round = 0; round < kRounds && problem.empty(); ++round) {
          append(cache, mine, fork_k[ut], fork_v[ut], 1 + (round * 7 + t) % 9, seed += 2);
          if (round % 5 == 0) {
            // A fork of my own sequence, grown and checked, then removed.
            const SequenceId child = cache.fork(mine);
            Rows child_k = fork_k[ut], child_v = fork_v[ut];
            append(cache, child, child_k, child_v, 1 + round % 6, seed += 2);
            problem = check(cache, child, child_k, child_v);
            cache.remove(child);
          }
          if (round % 7 == 3) {
            const SequenceId fresh = cache.add_sequence();
            Rows fresh_k, fresh_v;
            append(cache, fresh, fresh_k, fresh_v, 5, seed += 2);
            if (problem.empty()) problem = check(cache, fresh, fresh_k, fresh_v);
            cache.remove(fresh);
          }
          if (problem.empty() && round % 4 == 1) problem = check(cache, parent, parent_k, parent_v);
          const cache::SequenceSnapshot snap = cache.impl().snapshot(mine);
          if (snap.length != cache.length(mine) || snap.page_count < 1 ||
              cache.pages_in_use() < snap.page_count || !cache.contains(mine)) {
            problem = "snapshot of sequence " + std::to_string(mine) + " disagrees";
          }
          (void)cache.sequences();
        }
        if (problem.empty()) problem = check(cache, mine, fork_k[ut], fork_v[ut]);
      } catch (const std::exception& error) {
        problem = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(problems[static_cast<std::size_t>(t)], "") << t;

  EXPECT_EQ(check(cache, parent, parent_k, parent_v), "");
  std::int64_t pages = 2;  // the parent's, of which page 0 is shared by every fork
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(check(cache, forks[static_cast<std::size_t>(t)], fork_k[static_cast<std::size_t>(t)],
                    fork_v[static_cast<std::size_t>(t)]),
              "");
    pages += (cache.length(forks[static_cast<std::size_t>(t)]) + kPageRows - 1) / kPageRows - 1;
  }
  EXPECT_EQ(cache.pages_in_use(), pages);
  EXPECT_EQ(cache.sequences().size(), static_cast<std::size_t>(kThreads + 1));
}

}  // namespace
}  // namespace qkv
