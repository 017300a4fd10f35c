// read_tensor_rows: some rows along the second-to-last axis, from every format (.npy,
// safetensors, stored and deflated .npz members), equal to the same rows of the whole tensor as
// read_tensor reads it; the spans' rule and the whole readers' checks enforced.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/npz_builder.h"
#include "io/safetensors_builder.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/tensor.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using testing::ScratchDir;

// A [2, 3, 7, 5] tensor whose element at (a, b, r, c) says where it came from.
Tensor numbered(DType dtype) {
  Tensor t(DType::kF32, {2, 3, 7, 5}, "t");
  float* x = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) x[i] = static_cast<float>(i % 251) - 100.0f;
  return t.to(dtype);
}

// The rows of `spans` of the whole tensor, sliced here in the plainest way.
Tensor slice(const Tensor& whole, const std::vector<RowSpan>& spans) {
  const Shape& s = whole.shape();
  const std::int64_t rows = s[s.size() - 2], cols = s.back();
  std::int64_t kept = 0;
  for (const RowSpan& span : spans) kept += span.last - span.first;
  Shape shape = s;
  shape[s.size() - 2] = kept;
  Tensor part(whole.dtype(), shape, "part");
  const std::size_t row_bytes = dtype_size(whole.dtype()) * static_cast<std::size_t>(cols);
  const auto* from = static_cast<const char*>(whole.data());
  auto* to = static_cast<char*>(part.data());
  const std::int64_t outer = rows == 0 ? 0 : whole.numel() / (rows * cols);
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const RowSpan& span : spans) {
      for (std::int64_t r = span.first; r < span.last; ++r) {
        std::memcpy(to, from + static_cast<std::size_t>(o * rows + r) * row_bytes, row_bytes);
        to += row_bytes;
      }
    }
  }
  return part;
}

void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0);
}

std::vector<char> npy_bytes(const Tensor& t) { return encode_npy(t.view(), t.dtype()); }

// One file of each kind holding `t` (as "t"), by spec.
std::vector<std::string> files_holding(const ScratchDir& dir, const Tensor& t) {
  write_npy(dir / "t.npy", t.view(), t.dtype());
  testing::write_npz(dir / "stored.npz", {{"other.npy", npy_bytes(numbered(DType::kF32)), false},
                                          {"t.npy", npy_bytes(t), false}});
  testing::write_npz(dir / "deflated.npz", {{"t.npy", npy_bytes(t), true},
                                            {"other.npy", npy_bytes(numbered(DType::kF32)), true}});
  std::vector<std::string> specs = {(dir / "t.npy").string(), (dir / "stored.npz").string() + ":t",
                                    (dir / "deflated.npz").string() + ":t"};
  if (t.dtype() == DType::kF32 || t.dtype() == DType::kF16) {
    const std::string kind = t.dtype() == DType::kF32 ? "F32" : "F16";
    testing::write_bytes(
        dir / "t.safetensors",
        testing::safetensors_bytes({testing::safetensors_item("t", numbered(DType::kF32), kind)}));
    specs.push_back((dir / "t.safetensors").string() + ":t");
  }
  return specs;
}

TEST(ReadTensorRows, EqualsTheSameRowsOfTheWholeTensorInEveryFormat) {
  const std::vector<std::vector<RowSpan>> cases = {
      {{0, 7}}, {{1, 3}, {5, 7}}, {{0, 1}, {6, 7}}, {{2, 2}}, {}, {{3, 4}}, {{0, 0}, {0, 2}}};
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kF64}) {
    ScratchDir dir;
    const Tensor t = numbered(dtype);
    for (const std::string& spec : files_holding(dir, t)) {
      const Tensor whole = read_tensor(spec);
      for (const auto& spans : cases) {
        SCOPED_TRACE(spec + " with " + std::to_string(spans.size()) + " spans");
        expect_same(read_tensor_rows(spec, spans), slice(whole, spans));
      }
    }
  }
}

TEST(ReadTensorRows, BoolRowsAreCheckedLikeTheWholeTensor) {
  ScratchDir dir;
  Tensor mask(DType::kBool, {4, 6}, "mask");
  auto* m = static_cast<unsigned char*>(mask.data());
  for (std::int64_t i = 0; i < mask.numel(); ++i) m[i] = (i % 3) == 0;
  write_npy(dir / "mask.npy", mask.view(), DType::kBool);
  expect_same(read_tensor_rows((dir / "mask.npy").string(), std::vector<RowSpan>{{1, 3}}),
              slice(mask, {{1, 3}}));
  // A byte of 2 in row 2 is refused when row 2 is read, as read_tensor refuses the file.
  std::vector<char> bytes = encode_npy(mask.view(), DType::kBool);
  bytes[bytes.size() - 24 + 2 * 6 + 1] = 2;
  {
    std::ofstream out(dir / "bad.npy", std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const std::string bad = (dir / "bad.npy").string();
  EXPECT_THROW(read_tensor(bad), Error);
  try {
    read_tensor_rows(bad, std::vector<RowSpan>{{2, 3}});
    FAIL() << "a bool byte of 2 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bool data must be 0 or 1"), std::string::npos)
        << e.what();
  }
}

TEST(ReadTensorRows, RefusesSpansOutOfOrderOverlappingOrPastTheRows) {
  ScratchDir dir;
  const Tensor t = numbered(DType::kF32);
  for (const std::string& spec : files_holding(dir, t)) {
    for (const std::vector<RowSpan>& spans : std::vector<std::vector<RowSpan>>{
             {{3, 5}, {1, 2}}, {{0, 3}, {2, 4}}, {{5, 8}}, {{-1, 2}}, {{4, 3}}}) {
      try {
        read_tensor_rows(spec, spans);
        ADD_FAILURE() << spec << ": spans accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("row spans must be ascending"), std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(ReadTensorRows, NeedsRowsAndColumns) {
  ScratchDir dir;
  Tensor flat(DType::kF32, {5}, "flat");
  write_npy(dir / "flat.npy", flat.view(), DType::kF32);
  try {
    read_tensor_rows((dir / "flat.npy").string(), std::vector<RowSpan>{{0, 1}});
    FAIL() << "a 1-D tensor gave rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 2 dims"), std::string::npos) << e.what();
  }
}

TEST(ReadTensorRows, ADamagedDeflatedMemberFailsItsChecksumEvenWhenItsRowsComeFirst) {
  ScratchDir dir;
  // Zeros deflate to a short stream; the member's stored CRC is then made wrong, so that only
  // inflating to the end can tell.
  const Tensor zeros(DType::kF32, {64, 32}, "zeros");
  testing::write_npz(dir / "z.npz", {{"t.npy", npy_bytes(zeros), true}});
  const std::string spec = (dir / "z.npz").string() + ":t";
  ASSERT_NO_THROW(read_tensor_rows(spec, std::vector<RowSpan>{{0, 1}}));
  std::string archive;
  {
    std::ifstream in(dir / "z.npz", std::ios::binary);
    archive.assign(std::istreambuf_iterator<char>(in), {});
  }
  // The local header's CRC-32 (bytes 14..17) and the central directory's (16 bytes into its
  // entry, which starts with PK\1\2).
  const std::size_t central = archive.find(std::string("PK\1\2", 4));
  ASSERT_NE(central, std::string::npos);
  for (const std::size_t at : {std::size_t{14}, central + 16})
    archive[at] = static_cast<char>(archive[at] ^ 0x5a);
  {
    std::ofstream out(dir / "z.npz", std::ios::binary | std::ios::trunc);
    out.write(archive.data(), static_cast<std::streamsize>(archive.size()));
  }
  EXPECT_THROW(read_tensor(spec), Error);
  try {
    read_tensor_rows(spec, std::vector<RowSpan>{{0, 1}});
    FAIL() << "a member with a wrong CRC-32 was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CRC"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qkv
