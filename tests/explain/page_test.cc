// The page and SVG writers: self-contained (nothing that could fetch), the data block cannot be
// closed early by a label, and the SVG has one rect per cell. The browser test (tests/browser)
// checks what the page does.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "qkv/explain.h"
#include "support/test_support.h"

namespace qkv {
namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::vector<std::vector<HeadScan>> scans_of(const std::vector<Explanation>& parts) {
  std::vector<std::vector<HeadScan>> scans;
  for (const Explanation& e : parts) {
    auto& heads = scans.emplace_back();
    for (std::int64_t h = 0; h < e.heads; ++h) heads.push_back(scan_head(e, h));
  }
  return scans;
}

TEST(HtmlPage, IsSelfContained) {
  const std::vector<Explanation> parts = builtin_examples();
  const std::string page = html_page(parts, scans_of(parts));
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(page.find("Content-Security-Policy"), std::string::npos);
  for (const char* fetches : {"src=", "<link", "@import", "url(", "https:", "fetch("}) {
    EXPECT_EQ(page.find(fetches), std::string::npos) << fetches;
  }
  // The one http: string is the SVG namespace, an identifier that is never requested.
  EXPECT_EQ(count(page, "http:"), count(page, "http://www.w3.org/2000/svg"));
  EXPECT_NE(page.find("\"Groundhog Day\""), std::string::npos);
}

TEST(HtmlPage, LabelsCannotCloseTheDataBlock) {
  const Tensor q = testing::random_tensor(DType::kF64, {2, 4}, 1);
  const Tensor k = testing::random_tensor(DType::kF64, {3, 4}, 2);
  const Tensor v = testing::random_tensor(DType::kF64, {3, 2}, 3);
  ExplainSetup setup;
  setup.query_labels = {"</script><script>alert(1)</script>", "\"quoted\"\\"};
  setup.key_labels = {"a\tb", "c", "é"};
  const std::vector<Explanation> parts = {
      explain_attention(q.view(), k.view(), v.view(), {}, setup)};
  const std::string page = html_page(parts, scans_of(parts));
  EXPECT_EQ(count(page, "</script>"), 2u);  // the data block's and the script's own
  EXPECT_NE(page.find("\\u003c/script>"), std::string::npos);
  EXPECT_NE(page.find("\\\"quoted\\\"\\\\"), std::string::npos);
  EXPECT_NE(page.find("a\\u0009b"), std::string::npos);
}

TEST(HtmlPage, LargeMasksAreNotEmbedded) {
  const std::int64_t n = 1600;  // 1600^2 > 2^21 mask values
  const Tensor q = testing::random_tensor(DType::kF32, {n, 2}, 1);
  const Tensor k = testing::random_tensor(DType::kF32, {n, 2}, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {n, 2}, 3);
  Tensor mask(DType::kBool, {n, n}, "big_mask.npy");
  std::fill_n(mask.data_as<bool>(), n * n, true);
  AttentionOptions options;
  options.mask = mask.view();
  const std::vector<Explanation> parts = {explain_attention(q.view(), k.view(), v.view(), options)};
  const std::string page = html_page(parts, scans_of(parts));
  // Past the page's byte budget the mask is not embedded: rows come precomputed (sampled).
  EXPECT_NE(page.find("\"rowsMode\":\"sampled\""), std::string::npos);
  EXPECT_EQ(page.find("\"maskBias\""), std::string::npos);
  EXPECT_LT(page.size(), 4u << 20);  // pooled maps and n·d arrays, never n x n
}

TEST(HeatmapSvg, HasOneRectPerCellAndLabels) {
  const std::vector<Explanation> parts = builtin_examples();
  const std::string svg = heatmap_svg(parts[0], 0);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  // Background + 4 x 6 cells + 10 legend swatches.
  EXPECT_EQ(count(svg, "<rect"), 1u + 24u + 10u);
  EXPECT_NE(svg.find(">Chloe</text>"), std::string::npos);
  EXPECT_NE(svg.find(">Titanic</text>"), std::string::npos);
}

TEST(HeatmapSvg, PoolsLongInputs) {
  const Tensor q = testing::random_tensor(DType::kF32, {300, 4}, 1);
  const Tensor k = testing::random_tensor(DType::kF32, {500, 4}, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {500, 2}, 3);
  const Explanation e = explain_attention(q.view(), k.view(), v.view(), {});
  const std::string svg = heatmap_svg(e, 0, 128);
  EXPECT_EQ(count(svg, "<rect"), 1u + 128u * 128u + 10u);
  EXPECT_NE(svg.find("max-pooled to 128 x 128"), std::string::npos);
}

}  // namespace
}  // namespace qkv
