// The sentences explain says: the template rules (values, agreement), numbers that never read
// "-0.0000", and the honest counts of a masked row, in the terminal text.
#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "explain/wording.h"
#include "qkv/explain.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using explain_detail::count;
using explain_detail::fixed;
using explain_detail::say;

TEST(Wording, CountsAgreeWithTheirNouns) {
  EXPECT_EQ(say("overview.sizes", {{"nq", "1"}, {"nk", "2"}, {"d", "4"}, {"dv", "3"}, {"heads", "1"}}),
            "1 query, 2 keys, d_k = 4, d_v = 3, 1 head");
  EXPECT_EQ(say("overview.sizes", {{"nq", "11"}, {"nk", "1"}, {"d", "4"}, {"dv", "3"}, {"heads", "21"}}),
            "11 queries, 1 key, d_k = 4, d_v = 3, 21 heads");
  EXPECT_EQ(say("weights.more", {{"rest", "1"}}), "(1 more allowed key)");
  EXPECT_EQ(say("weights.more", {{"rest", "0"}}), "(0 more allowed keys)");
  EXPECT_EQ(count(1, "row", "rows"), "1 row");
  EXPECT_EQ(count(0, "row", "rows"), "0 rows");
}

TEST(Wording, MissingValuesAndUnknownPhrasesAreProgrammingErrors) {
  EXPECT_THROW(say("no such phrase"), std::logic_error);
  EXPECT_THROW(say("weights.more", {}), std::logic_error);
}

TEST(Wording, NumbersNeverReadMinusZero) {
  EXPECT_EQ(fixed(-0.0), "0.0000");
  EXPECT_EQ(fixed(-0.00004), "0.0000");
  EXPECT_EQ(fixed(-0.00005001), "-0.0001");
  EXPECT_EQ(fixed(-1e-300, 2), "0.00");
  EXPECT_EQ(fixed(1.23456), "1.2346");
  EXPECT_EQ(fixed(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(fixed(std::numeric_limits<double>::infinity()), "inf");
}

TEST(Wording, ThePageGetsTheSameTable) {
  const std::string json = explain_detail::phrases_json();
  EXPECT_NE(json.find("\"entropy\":\"entropy {entropy} nats;"), std::string::npos) << json;
  EXPECT_EQ(json.find('<'), std::string::npos);  // nothing can close the page's script block
}

// A long row with 2 allowed keys of 300: only those two are ranked, listed and counted.
TEST(WordingInText, OnlyAllowedKeysAreRankedAndCounted) {
  const Tensor q = testing::random_tensor(DType::kF64, {1, 8}, 21);
  const Tensor k = testing::random_tensor(DType::kF64, {300, 8}, 22);
  const Tensor v = testing::random_tensor(DType::kF64, {300, 4}, 23);
  Tensor mask(DType::kBool, {1, 300}, "mask");
  for (std::int64_t j = 0; j < 300; ++j) mask.data_as<bool>()[j] = j == 7 || j == 250;
  AttentionOptions options;
  options.mask = mask.view();
  const Explanation e = explain_attention(q.view(), k.view(), v.view(), options);
  const std::string text = format_walk_through(e, walk_through(e, 0, 0), 8);
  EXPECT_NE(text.find("(298 keys are not allowed for this query and left out)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("over the 2 allowed keys"), std::string::npos) << text;
  EXPECT_NE(text.find("of 2 allowed"), std::string::npos) << text;
  EXPECT_EQ(text.find("heaviest of"), std::string::npos) << text;  // both are listed
  EXPECT_EQ(text.find("more allowed"), std::string::npos) << text;
  EXPECT_EQ(text.find("-inf\n"), std::string::npos) << text;  // no forbidden key is listed
  EXPECT_EQ(text.find("-0.0000"), std::string::npos) << text;
}

// A row with no allowed key says so, instead of "exp(entropy) = 0.00 of 0 allowed".
TEST(WordingInText, ARowWithNoAllowedKeySaysSo) {
  const Tensor q = testing::random_tensor(DType::kF64, {2, 4}, 31);
  const Tensor k = testing::random_tensor(DType::kF64, {3, 4}, 32);
  const Tensor v = testing::random_tensor(DType::kF64, {3, 2}, 33);
  Tensor mask(DType::kBool, {2, 3}, "mask");
  for (std::int64_t c = 0; c < 6; ++c) mask.data_as<bool>()[c] = c >= 3;  // row 0: none
  AttentionOptions options;
  options.mask = mask.view();
  const Explanation e = explain_attention(q.view(), k.view(), v.view(), options);
  const std::string text = format_walk_through(e, walk_through(e, 0, 0), 8);
  EXPECT_NE(text.find("no key is allowed for this query"), std::string::npos) << text;
  EXPECT_NE(text.find("no allowed key, so no entropy"), std::string::npos) << text;
  EXPECT_EQ(text.find("of 0 allowed"), std::string::npos) << text;
  EXPECT_EQ(text.find("-0.0000"), std::string::npos) << text;
  EXPECT_EQ(format_overview(e).find("2 queries, 3 keys"), 2u) << format_overview(e);
}

}  // namespace
}  // namespace qkv
