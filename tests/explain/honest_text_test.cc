// The terminal walk-through says only true things about masked rows and cross-attention
// (issue 12): `qkv explain` is run as a user would, and its whole stdout is scanned.
//
// What is checked, and where the expectation comes from (never from qkv's own output):
//   - which keys a row may see is worked out here from the rule itself (causal: j <= i + nk - nq;
//     window l,r: diag - l <= j <= diag + r; a bool mask: the file written here);
//   - a walk-through of a row with A allowed keys of nk lists no forbidden key among its
//     heaviest keys (keys are labelled "key-<j>" so that every mention can be found), counts
//     "of A allowed", and never counts nk ("of 30", "all 30 keys") when A < nk;
//   - a row with no allowed key says so and prints no "exp(entropy) = 0.00 of 0 allowed";
//   - everywhere: no "-0.0000" (a negative zero printed), no "1 keys"/"1 queries"/"1 heads"
//     and no "2 key"/"3 query" (counts agree with their noun), "the rest below" is followed by
//     the line that counts the rest;
//   - cross-attention (the layer form with --memory, and part 1 of the built-in example, users
//     against films) reports no distance |j - i|: positions of two sequences are not comparable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"
#include "walk_through_header.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;
using testing::CommandRun;

CommandRun qkv_run(const fs::path& dir, const std::vector<std::string>& args) {
  return testing::run_program(QKV_CLI_PATH, dir, args, 120);
}

// One row's walk-through: from its "── query i ..." line to the next one (or the next part).
struct Section {
  std::int64_t row = -1;
  std::int64_t head = 0;
  std::string text;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}


std::vector<Section> sections_of(const std::string& out) {
  std::vector<Section> sections;
  bool open = false;
  for (const std::string& line : lines_of(out)) {
    Section s;
    if (testing::parse_walk_through_header(line, s.row, s.head)) {
      sections.push_back(s);
      open = true;
    } else if (line.rfind("Part ", 0) == 0 || line.rfind("What the example shows", 0) == 0) {
      open = false;
    }
    if (open) sections.back().text += line + "\n";
  }
  return sections;
}

// Rules that hold for any output of qkv explain.
void expect_honest_everywhere(const std::string& out, const std::string& what) {
  SCOPED_TRACE(what);
  // A printed negative zero, at any number of decimals ("-0.00", "-0.0000", not "-0.0001").
  static const std::regex negative_zero("-0\\.0+(?![0-9])");
  EXPECT_FALSE(std::regex_search(out, negative_zero)) << out;
  // Nouns and verbs agree with their counts: "1 key", "1 more allowed key", "1 other allowed
  // key weighs", "1 key is"; "2 keys", "5 other allowed keys weigh", "28 keys are".
  static const std::regex one_many(
      "(^|[^0-9.,])1 (more |other )?(allowed )?(queries|keys|heads|rows|values|key/value heads)"
      "\\b|(^|[^0-9.,])1 (other )?(allowed )?key (weigh|are)\\b");
  std::smatch m;
  EXPECT_FALSE(std::regex_search(out, m, one_many)) << "'" << m.str() << "' in\n" << out;
  static const std::regex many_one(
      "(^|[^0-9.,])(0|[2-9]|[1-9][0-9]+) (more |other )?(allowed )?(query|key|head|row)"
      "(?![A-Za-z/_-])|(^|[^0-9.,])(0|[2-9]|[1-9][0-9]+) (other )?(allowed )?keys (weighs|is)\\b");
  EXPECT_FALSE(std::regex_search(out, m, many_one)) << "'" << m.str() << "' in\n" << out;
  EXPECT_EQ(out.find("of 0 allowed"), std::string::npos) << out;
  // An effective number of keys, exp(entropy), cannot exceed the keys it is counted among:
  // exp(H) <= A for any distribution over A keys (2 decimals printed: 0.005 of slack).
  static const std::regex effective("exp\\(entropy\\) = ([0-9.]+) of ([0-9]+) allowed");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), effective);
       it != std::sregex_iterator(); ++it) {
    EXPECT_LE(std::stod((*it)[1].str()), std::stod((*it)[2].str()) + 0.005)
        << "'" << it->str() << "': more effective keys than allowed ones";
  }
  // "the rest below" promises a line that counts the rest ("(22 more) 0.1234 in all").
  static const std::regex rest_line("\\([0-9]+ more[^)]*\\)");
  for (const Section& s : sections_of(out)) {
    const std::size_t at = s.text.find("the rest below");
    if (at == std::string::npos) continue;
    const std::string after = s.text.substr(at);
    EXPECT_TRUE(std::regex_search(after, rest_line))
        << "query " << s.row << ", head " << s.head << ": \"the rest below\" and no rest:\n"
        << s.text;
  }
}

// No distance statistic: a line that mentions distance (or |j - i|) only says there is none
// ("no distance ... is measured") and holds no number.
void expect_no_distance(const std::string& text, const std::string& what) {
  SCOPED_TRACE(what);
  static const std::regex number("[0-9]+\\.[0-9]+");
  for (const std::string& line : lines_of(text)) {
    std::string lower = line;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower.find("distance") == std::string::npos && line.find("|j - i|") == std::string::npos &&
        line.find("|j − i|") == std::string::npos) {
      continue;
    }
    EXPECT_NE(lower.find("no distance"), std::string::npos) << "a distance statistic: " << line;
    EXPECT_FALSE(std::regex_search(line, number)) << "a distance statistic: " << line;
  }
}

// Which keys row i may see, worked out here from the rule.
using AllowedRule = std::function<bool(std::int64_t i, std::int64_t j)>;

// The checks of one masked walk-through, keys labelled key-<j>, nk keys in all.
void expect_honest_row(const Section& s, std::int64_t nk, const AllowedRule& allowed) {
  SCOPED_TRACE("query " + std::to_string(s.row) + ", head " + std::to_string(s.head));
  std::set<std::int64_t> keys;
  for (std::int64_t j = 0; j < nk; ++j) {
    if (allowed(s.row, j)) keys.insert(j);
  }
  const auto count = static_cast<std::int64_t>(keys.size());
  static const std::regex label("key-([0-9]+)\\b");
  for (auto it = std::sregex_iterator(s.text.begin(), s.text.end(), label);
       it != std::sregex_iterator(); ++it) {
    const std::int64_t j = std::stoll((*it)[1].str());
    EXPECT_TRUE(keys.count(j) == 1)
        << "lists key-" << j << ", which the mask forbids for row " << s.row << ":\n"
        << s.text;
  }
  if (count == 0) {
    EXPECT_TRUE(std::regex_search(s.text, std::regex("[Nn]o (allowed )?key")))
        << "a row with no allowed key must say so:\n"
        << s.text;
    EXPECT_EQ(s.text.find("exp(entropy)"), std::string::npos) << s.text;
  } else {
    EXPECT_NE(s.text.find("of " + std::to_string(count) + " allowed"), std::string::npos)
        << "expected \"of " << count << " allowed\":\n"
        << s.text;
  }
  // "(28 keys are not allowed ...)" must count the forbidden keys: nk - A.
  static const std::regex forbidden("([0-9]+) keys? (are|is) not allowed");
  std::string rest = s.text;
  std::smatch m;
  if (std::regex_search(s.text, m, forbidden)) {
    EXPECT_EQ(std::stoll(m[1].str()), nk - count) << s.text;
    rest = m.prefix().str() + m.suffix().str();
  }
  if (count < nk) {
    const std::string n = std::to_string(nk);
    const std::regex counts_all("(of|all) " + n + "\\b|\\b" + n + " keys");
    EXPECT_FALSE(std::regex_search(rest, m, counts_all))
        << "counts all " << nk << " keys ('" << m.str() << "') where " << count << " are allowed:\n"
        << s.text;
  }
  // Step 4 ranks every allowed key: its bars (one line per key) and its "(K more ...)" line
  // add up to A.
  const std::size_t step4 = s.text.find("\n4. ");
  const std::size_t step6 = s.text.find("\n6. ");
  if (count > 0 && step4 != std::string::npos && step6 != std::string::npos) {
    const std::string ranked = s.text.substr(step4, step6 - step4);
    const std::size_t step5 = ranked.find("\n5. ");
    const std::string bars_text = ranked.substr(0, step5);
    static const std::regex bar_line("\n +key-[0-9]+ +[0-9]\\.[0-9]+ ");
    static const std::regex more_line("\\(([0-9]+) more");
    const auto bars = std::distance(
        std::sregex_iterator(bars_text.begin(), bars_text.end(), bar_line), std::sregex_iterator());
    const std::int64_t more =
        std::regex_search(bars_text, m, more_line) ? std::stoll(m[1].str()) : 0;
    EXPECT_EQ(bars + more, count) << "step 4 ranks " << bars << " keys and " << more << " more, of "
                                  << count << " allowed:\n"
                                  << s.text;
  }
}

class HonestText : public ::testing::Test {
 protected:
  static constexpr std::int64_t kNq = 20, kNk = 30;
  void SetUp() override {
    // Two query heads sharing one key/value head (GQA): "sharing 1 key/value head".
    write_npy(dir_ / "q.npy", testing::random_tensor(DType::kF32, {2, kNq, 8}, 11).view(),
              DType::kF32);
    write_npy(dir_ / "k.npy", testing::random_tensor(DType::kF32, {1, kNk, 8}, 12).view(),
              DType::kF32);
    write_npy(dir_ / "v.npy", testing::random_tensor(DType::kF32, {1, kNk, 4}, 13).view(),
              DType::kF32);
    std::ofstream labels(dir_ / "keys.txt");
    for (std::int64_t j = 0; j < kNk; ++j) labels << "key-" << j << "\n";
  }

  // Runs explain on q, k, v with `extra` flags, walking through `rows`; checks every section.
  std::string run_rows(const std::vector<std::string>& extra, const std::string& rows,
                       const AllowedRule& allowed, std::size_t expected_sections) {
    std::vector<std::string> args = {"explain", "--q",   "q.npy", "--k",        "k.npy",   "--v",
                                     "v.npy",   "--row", rows,    "--labels-k", "keys.txt"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandRun run = qkv_run(dir_.path(), args);
    EXPECT_EQ(run.status, 0) << run.err;
    const std::vector<Section> sections = sections_of(run.out);
    EXPECT_EQ(sections.size(), expected_sections) << run.out;
    for (const Section& s : sections) expect_honest_row(s, kNk, allowed);
    expect_honest_everywhere(run.out, "qkv explain " + rows);
    return run.out;
  }

  testing::ScratchDir dir_;
};

// Causal with 10 more keys than queries: row i sees keys 0..i+10 (11 to 30 of them).
TEST_F(HonestText, CausalRowsCountTheirAllowedKeys) {
  const std::string out = run_rows(
      {"--causal"}, "0,3,19", [](std::int64_t i, std::int64_t j) { return j <= i + kNk - kNq; }, 6);
  EXPECT_NE(out.find("sharing 1 key/value head"), std::string::npos) << out;
}

// A window of 2 keys to the left: 3 allowed keys per row, fewer than the 8 heaviest shown.
TEST_F(HonestText, WindowRowsListOnlyAllowedKeys) {
  run_rows(
      {"--window", "2,0"}, "0,5,19",
      [](std::int64_t i, std::int64_t j) {
        const std::int64_t diag = i + kNk - kNq;
        return j >= diag - 2 && j <= diag;
      },
      6);
}

// A bool mask: row 4 allows 2 keys, row 7 none, row 9 one, the rest about half at random.
TEST_F(HonestText, BoolMaskRowsWithTwoOneAndNoKeys) {
  Tensor mask(DType::kBool, {kNq, kNk}, "mask.npy");
  bool* m = mask.data_as<bool>();
  const Tensor coin = testing::random_tensor(DType::kF64, {kNq, kNk}, 14);
  for (std::int64_t e = 0; e < kNq * kNk; ++e) m[e] = coin.data_as<double>()[e] > 0.0;
  for (std::int64_t j = 0; j < kNk; ++j) {
    m[4 * kNk + j] = j == 3 || j == 17;
    m[7 * kNk + j] = false;
    m[9 * kNk + j] = j == 29;
  }
  write_npy(dir_ / "mask.npy", mask.view(), DType::kBool);
  const std::vector<bool> rule(m, m + kNq * kNk);
  const std::string out = run_rows(
      {"--mask", "mask.npy"}, "4,7,9,12",
      [&](std::int64_t i, std::int64_t j) {
        return static_cast<bool>(rule[static_cast<std::size_t>(i * kNk + j)]);
      },
      8);
  EXPECT_NE(out.find("of 2 allowed"), std::string::npos) << out;
  EXPECT_NE(out.find("of 1 allowed"), std::string::npos) << out;
}

// Causal on a square input (20 keys): row 0 has exactly one key, row 1 two.
TEST_F(HonestText, OneKeyRow) {
  write_npy(dir_ / "k.npy", testing::random_tensor(DType::kF32, {1, kNq, 8}, 15).view(),
            DType::kF32);
  write_npy(dir_ / "v.npy", testing::random_tensor(DType::kF32, {1, kNq, 4}, 16).view(),
            DType::kF32);
  std::ofstream labels(dir_ / "keys20.txt");
  for (std::int64_t j = 0; j < kNq; ++j) labels << "key-" << j << "\n";
  labels.close();
  const CommandRun run =
      qkv_run(dir_.path(), {"explain", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--causal",
                            "--row", "0,1", "--head", "0", "--labels-k", "keys20.txt"});
  ASSERT_EQ(run.status, 0) << run.err;
  const std::vector<Section> sections = sections_of(run.out);
  ASSERT_EQ(sections.size(), 2u) << run.out;
  for (const Section& s : sections) {
    expect_honest_row(s, kNq, [](std::int64_t i, std::int64_t j) { return j <= i; });
  }
  expect_honest_everywhere(run.out, "one-key row");
}

// Values that round to zero: Q, K and V hold tiny negative numbers (-1e-7) and every modifier
// that prints a column is on (softcap, ALiBi: its term is -0.0 on the diagonal, sinks); no
// "-0.0000" may appear anywhere.
TEST_F(HonestText, TinyNegativeValuesPrintAsZero) {
  Tensor q = testing::random_tensor(DType::kF64, {2, kNq, 8}, 17);
  Tensor k = testing::random_tensor(DType::kF64, {1, kNk, 8}, 18);
  Tensor v = testing::random_tensor(DType::kF64, {1, kNk, 4}, 19);
  for (Tensor* t : {&q, &k, &v}) {
    for (std::int64_t e = 0; e < t->numel(); e += 3) t->data_as<double>()[e] = -1e-7;
  }
  write_npy(dir_ / "q.npy", q.view(), DType::kF64);
  write_npy(dir_ / "k.npy", k.view(), DType::kF64);
  write_npy(dir_ / "v.npy", v.view(), DType::kF64);
  write_npy(dir_ / "s.npy", testing::random_tensor(DType::kF64, {2}, 20).view(), DType::kF64);
  run_rows(
      {"--causal", "--softcap", "2", "--alibi", "--sinks", "s.npy"}, "0,1,19",
      [](std::int64_t i, std::int64_t j) { return j <= i + kNk - kNq; }, 6);
}

// --top 1 and --top 2 on rows with 2, 3 and 11 allowed keys: "1 more allowed key", "1 other
// allowed key weighs less", and the plurals, wherever the text counts what it leaves out.
TEST_F(HonestText, SmallTopCountsAgree) {
  for (const char* top : {"1", "2"}) {
    run_rows(
        {"--window", "2,0", "--top", top}, "0,1",
        [](std::int64_t i, std::int64_t j) {
          const std::int64_t diag = i + kNk - kNq;
          return j >= diag - 2 && j <= diag;
        },
        4);
    run_rows(
        {"--causal", "--top", top}, "0",
        [](std::int64_t i, std::int64_t j) { return j <= i + kNk - kNq; }, 2);
  }
}

// A bool mask with a row of no allowed key, and sinks: the sink takes the whole denominator.
TEST_F(HonestText, NoKeyRowWithSinks) {
  Tensor mask(DType::kBool, {kNq, kNk}, "mask.npy");
  bool* m = mask.data_as<bool>();
  for (std::int64_t e = 0; e < kNq * kNk; ++e) m[e] = e / kNk != 3;
  write_npy(dir_ / "mask.npy", mask.view(), DType::kBool);
  write_npy(dir_ / "s.npy", testing::random_tensor(DType::kF64, {2}, 20).view(), DType::kF64);
  run_rows(
      {"--mask", "mask.npy", "--sinks", "s.npy"}, "2,3",
      [](std::int64_t i, std::int64_t) { return i != 3; }, 4);
}

// A sink is a term of the softmax's denominator, so with one the key weights sum to less than
// 1; the entropy and effective number of keys must still describe a distribution over the
// allowed keys (or say the sink is counted), never more effective keys than allowed ones.
// Row 0 of a square causal input has one key: "exp(entropy) = 1.00 of 1 allowed" at most.
TEST_F(HonestText, SinkKeepsEffectiveKeysWithinAllowed) {
  write_npy(dir_ / "k.npy", testing::random_tensor(DType::kF32, {1, kNq, 8}, 15).view(),
            DType::kF32);
  write_npy(dir_ / "v.npy", testing::random_tensor(DType::kF32, {1, kNq, 4}, 16).view(),
            DType::kF32);
  Tensor sinks(DType::kF64, {2}, "s.npy");
  sinks.data_as<double>()[0] = 0.0;
  sinks.data_as<double>()[1] = 1.0;
  write_npy(dir_ / "s.npy", sinks.view(), DType::kF64);
  const CommandRun run =
      qkv_run(dir_.path(), {"explain", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--causal",
                            "--sinks", "s.npy", "--row", "0,1,5"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(sections_of(run.out).size(), 6u) << run.out;
  expect_honest_everywhere(run.out, "sinks");
}

// Cross-attention in the layer form: queries from X (5 rows), keys and values from a memory of
// 9 rows; no distance is reported, and the rows say nothing untrue.
TEST(HonestTextCross, LayerFormWithMemoryReportsNoDistance) {
  testing::ScratchDir dir;
  write_npy(dir / "x.npy", testing::random_tensor(DType::kF64, {5, 6}, 21).view(), DType::kF64);
  write_npy(dir / "m.npy", testing::random_tensor(DType::kF64, {9, 6}, 22).view(), DType::kF64);
  write_npy(dir / "wq.npy", testing::random_tensor(DType::kF64, {6, 4}, 23).view(), DType::kF64);
  write_npy(dir / "wk.npy", testing::random_tensor(DType::kF64, {6, 4}, 24).view(), DType::kF64);
  write_npy(dir / "wv.npy", testing::random_tensor(DType::kF64, {6, 4}, 25).view(), DType::kF64);
  const CommandRun run =
      qkv_run(dir.path(), {"explain", "--x", "x.npy", "--memory", "m.npy", "--wq", "wq.npy", "--wk",
                           "wk.npy", "--wv", "wv.npy", "--heads", "2"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_FALSE(sections_of(run.out).empty()) << run.out;
  expect_no_distance(run.out, "layer form with --memory");
  expect_honest_everywhere(run.out, "layer form with --memory");
}

// The built-in example: part 1 (users against films) is cross-attention; the whole text obeys
// the general rules.
TEST(HonestTextCross, BuiltinPartOneReportsNoDistance) {
  testing::ScratchDir dir;
  const CommandRun run = qkv_run(dir.path(), {"explain"});
  ASSERT_EQ(run.status, 0) << run.err;
  const std::size_t part1 = run.out.find("Part 1.");
  const std::size_t part2 = run.out.find("Part 2.");
  ASSERT_NE(part1, std::string::npos) << run.out;
  ASSERT_NE(part2, std::string::npos) << run.out;
  expect_no_distance(run.out.substr(part1, part2 - part1), "built-in part 1");
  expect_honest_everywhere(run.out, "built-in example");
}

}  // namespace
}  // namespace qkv
