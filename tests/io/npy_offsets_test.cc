// read_npy_offsets: the one reader of integer .npy files (the sequence offsets of a packed
// batch). It takes int32 and int64 as stored, refuses every other dtype naming the file, and
// keeps read_npy's rigour for everything else; read_npy still refuses integer files.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/tensor.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using testing::ScratchDir;

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A version 1.0 (or 2.0) .npy file with `header` padded to 64 bytes as NumPy pads it.
std::string npy(const std::string& descr, const std::string& shape, const std::string& data,
                int major = 1) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const std::size_t preamble = major == 1 ? 10 : 12;
  while ((preamble + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (std::size_t i = 0; i < preamble - 8; ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return out + header + data;
}

template <typename T>
std::string bytes_of(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

void expect_offsets_error(const std::filesystem::path& path, const std::string& expected) {
  try {
    read_npy_offsets(path);
    ADD_FAILURE() << "read_npy_offsets accepted " << path << "; expected: " << expected;
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), path.string());
    EXPECT_NE(e.problem().find(expected), std::string::npos) << e.problem();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
  // The header alone gives the same verdict.
  EXPECT_THROW(inspect_npy_offsets(path), Error) << path;
}

TEST(ReadNpyOffsets, Int32AsStored) {
  ScratchDir dir;
  write_file(dir / "cu.npy", npy("<i4", "(4,)", bytes_of<std::int32_t>({0, 5, 5, 17})));
  const Tensor t = read_npy_offsets(dir / "cu.npy");
  EXPECT_EQ(t.dtype(), DType::kI32);
  EXPECT_EQ(t.shape(), (Shape{4}));
  EXPECT_EQ(t.name(), (dir / "cu.npy").string());
  EXPECT_EQ(t.data_as<std::int32_t>()[3], 17);
  const TensorInfo info = inspect_npy_offsets(dir / "cu.npy");
  EXPECT_EQ(info.dtype, DType::kI32);
  EXPECT_EQ(info.shape, (Shape{4}));
  EXPECT_EQ(info.bytes, 16u);
}

TEST(ReadNpyOffsets, Int64AsStoredInEveryVersion) {
  ScratchDir dir;
  const std::int64_t big = std::int64_t{1} << 40;
  for (const int major : {1, 2, 3}) {
    write_file(dir / "cu.npy", npy("<i8", "(3,)", bytes_of<std::int64_t>({0, 7, big}), major));
    const Tensor t = read_npy_offsets(dir / "cu.npy");
    EXPECT_EQ(t.dtype(), DType::kI64);
    EXPECT_EQ(t.data_as<std::int64_t>()[2], big);
  }
}

TEST(ReadNpyOffsets, RoundTripsThroughEncodeNpy) {
  ScratchDir dir;
  for (const DType dtype : {DType::kI32, DType::kI64}) {
    Tensor t(DType::kF64, {5}, "cu");
    for (int i = 0; i < 5; ++i) t.data_as<double>()[i] = 3.0 * i;
    const Tensor offsets = t.to(dtype);
    write_npy(dir / "cu.npy", offsets.view(), dtype);
    const Tensor back = read_npy_offsets(dir / "cu.npy");
    ASSERT_EQ(back.dtype(), dtype);
    ASSERT_EQ(back.nbytes(), offsets.nbytes());
    EXPECT_EQ(std::memcmp(back.data(), offsets.data(), back.nbytes()), 0);
  }
}

TEST(ReadNpyOffsets, EmptyAndScalarShapesAreReadForTheLibraryToJudge) {
  ScratchDir dir;
  write_file(dir / "cu.npy", npy("<i8", "(0,)", ""));
  EXPECT_EQ(read_npy_offsets(dir / "cu.npy").numel(), 0);
  write_file(dir / "cu.npy", npy("<i4", "()", bytes_of<std::int32_t>({0})));
  EXPECT_EQ(read_npy_offsets(dir / "cu.npy").shape(), Shape{});
}

struct RefusedCase {
  std::string name;
  std::string bytes;
  std::string expected;
};

std::vector<RefusedCase> refused_cases() {
  const std::string i4 = bytes_of<std::int32_t>({0, 2, 4});
  return {
      {"Float32", npy("<f4", "(3,)", bytes_of<float>({0, 2, 4})),
       "dtype '<f4' cannot hold sequence offsets; they must be int32 ('<i4') or int64 ('<i8')"},
      {"Float64", npy("<f8", "(3,)", bytes_of<double>({0, 2, 4})), ".astype(np.int32)"},
      {"Float16", npy("<f2", "(2,)", "abcd"), "dtype '<f2' cannot hold sequence offsets"},
      {"Bool", npy("|b1", "(3,)", std::string("\0\1\1", 3)), "dtype '|b1' cannot hold"},
      {"Int16", npy("<i2", "(3,)", "abcdef"), "dtype '<i2' cannot hold sequence offsets"},
      {"UInt32", npy("<u4", "(3,)", i4), "dtype '<u4' cannot hold sequence offsets"},
      {"UInt8", npy("|u1", "(3,)", "abc"), "dtype '|u1' cannot hold"},
      {"BigEndianI4", npy(">i4", "(3,)", i4),
       "big-endian data ('>i4') is not supported; "
       "convert with .astype('<i4')"},
      {"BigEndianI8", npy(">i8", "(1,)", std::string(8, '\0')), ".astype('<i8')"},
      {"NativeOrderI4", npy("=i4", "(3,)", i4), "save it as '<i4'"},
      {"NoOrderI8", npy("i8", "(1,)", std::string(8, '\0')), "save it as '<i8'"},
      {"Object", npy("|O", "(1,)", std::string(8, '\0')), "dtype '|O' cannot hold"},
      {"HostileDescr", npy("<i4\x01\xff", "(1,)", "abcd"), "dtype '<i4\\x01\\xff' cannot hold"},
      {"TruncatedData", npy("<i4", "(3,)", i4.substr(0, 11)),
       "header claims 3 int32 values (12 bytes) but the file holds 11 bytes of data"},
      {"TrailingBytes", npy("<i8", "(1,)", std::string(9, '\0')), "file has 1 extra byte"},
      {"HugeClaimedShape", npy("<i8", "(1099511627776,)", std::string(16, '\0')),
       "header claims 1099511627776 int64 values (8 TiB) but the file holds 16 bytes"},
      {"ByteCountOverflows", npy("<i8", "(2305843009213693952,)", std::string(8, '\0')),
       "size in bytes does not fit in 64 bits"},
      {"NegativeDim", npy("<i4", "(-1,)", i4), "negative dimension '-1'"},
      {"NotNpy", std::string("0,2,4\n"), "not an .npy file"},
  };
}

class RefusedOffsets : public ::testing::TestWithParam<RefusedCase> {};

TEST_P(RefusedOffsets, NameTheFile) {
  ScratchDir dir;
  write_file(dir / "cu.npy", GetParam().bytes);
  expect_offsets_error(dir / "cu.npy", GetParam().expected);
}

INSTANTIATE_TEST_SUITE_P(All, RefusedOffsets, ::testing::ValuesIn(refused_cases()),
                         [](const ::testing::TestParamInfo<RefusedCase>& param_info) {
                           return param_info.param.name;
                         });

TEST(ReadNpyOffsets, MissingFile) {
  ScratchDir dir;
  expect_offsets_error(dir / "absent.npy", "cannot open: No such file or directory");
}

// The values reader still refuses integers, saying where they are read.
TEST(ReadNpy, IntegerFilesStayRefused) {
  ScratchDir dir;
  for (const auto& [descr, item_size] : {std::pair{"<i4", 4}, std::pair{"<i8", 8}}) {
    write_file(dir / "q.npy",
               npy(descr, "(1,)", std::string(static_cast<std::size_t>(item_size), '\0')));
    try {
      read_npy(dir / "q.npy");
      ADD_FAILURE() << "read_npy accepted " << descr;
    } catch (const Error& e) {
      EXPECT_EQ(e.subject(), (dir / "q.npy").string());
      EXPECT_NE(e.problem().find(std::string("integer dtype '") + descr + "' is not supported"),
                std::string::npos)
          << e.problem();
      EXPECT_NE(e.problem().find("integers only as the sequence offsets of a packed batch"),
                std::string::npos)
          << e.problem();
    }
    EXPECT_THROW(inspect_npy(dir / "q.npy"), Error);
  }
}

// Random damage to valid offset files: a tensor of an integer dtype or a one-line qkv::Error.
TEST(ReadNpyOffsets, DamagedFilesFailCleanly) {
  const std::vector<std::string> originals = {
      npy("<i4", "(4,)", bytes_of<std::int32_t>({0, 1, 3, 6})),
      npy("<i8", "(2,)", bytes_of<std::int64_t>({0, 9}), 2),
  };
  std::mt19937 rng(2024);
  ScratchDir dir;
  const auto path = dir / "damaged.npy";
  int accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes = originals[static_cast<std::size_t>(trial) % originals.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !bytes.empty(); ++e) {
      const std::size_t at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes[at] = "0123456789(),'\" {}:-<if48"[rng() % 26];
          break;
        case 2:
          bytes.resize(at);
          break;
        default:
          bytes.insert(at, 1, static_cast<char>(rng()));
          break;
      }
    }
    write_file(path, bytes);
    try {
      const Tensor t = read_npy_offsets(path);
      ++accepted;
      EXPECT_TRUE(t.dtype() == DType::kI32 || t.dtype() == DType::kI64) << dtype_name(t.dtype());
    } catch (const Error& e) {
      EXPECT_EQ(e.subject(), path.string());
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace qkv
