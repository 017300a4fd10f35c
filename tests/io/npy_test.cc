// read_npy and encode_npy: round trips, the header variants other writers produce, and a
// hostile set in which every file must be refused with one line naming the file and the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <ostream>
#include <random>
#include <string>
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

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string little_endian(std::uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return out;
}

// An .npy file written by hand. With `pad`, the header is padded to 64 bytes as NumPy does.
std::string npy_file(int major, int minor, std::string header, const std::string& data,
                     bool pad = true) {
  const std::size_t preamble = major == 1 ? 10 : 12;
  if (pad) {
    while ((preamble + header.size() + 1) % 64 != 0) header.push_back(' ');
    header.push_back('\n');
  }
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(static_cast<char>(minor));
  out += little_endian(header.size(), major == 1 ? 2 : 4);
  return out + header + data;
}

std::string npy_v1(const std::string& header, const std::string& data) {
  return npy_file(1, 0, header, data);
}

std::string header_for(const std::string& descr, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
}

template <typename T>
std::string bytes_of(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string f32_data(std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(i) * 0.5f - 1.0f;
  return bytes_of(values);
}

// ------------------------------------------------------------------------------------------
// Round trips through write_npy and read_npy.

void expect_round_trip(const TensorView& view, DType dtype) {
  ScratchDir dir;
  const auto path = dir / "t.npy";
  write_npy(path, view, dtype);
  const Tensor back = read_npy(path);
  EXPECT_EQ(back.name(), path.string());
  EXPECT_EQ(back.dtype(), dtype);
  EXPECT_EQ(back.shape(), view.shape);
  const Tensor expected = contiguous_copy(view, dtype);
  ASSERT_EQ(back.nbytes(), expected.nbytes());
  if (expected.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(back.data(), expected.data(), expected.nbytes()), 0);
  }
}

TEST(NpyRoundTrip, Float32Values) {
  Tensor t(DType::kF32, {2, 3}, "t");
  for (int i = 0; i < 6; ++i) t.data_as<float>()[i] = static_cast<float>(i) - 2.5f;
  expect_round_trip(t.view(), DType::kF32);
}

TEST(NpyRoundTrip, Float64FourDims) {
  const Tensor t = testing::random_tensor(DType::kF64, {2, 3, 4, 5}, 1);
  expect_round_trip(t.view(), DType::kF64);
}

TEST(NpyRoundTrip, Bool) {
  const Tensor t = testing::random_tensor(DType::kBool, {7, 9}, 2);
  expect_round_trip(t.view(), DType::kBool);
}

TEST(NpyRoundTrip, ZeroDimensional) {
  Tensor t(DType::kF64, {}, "scalar");
  t.data_as<double>()[0] = 3.25;
  expect_round_trip(t.view(), DType::kF64);
}

TEST(NpyRoundTrip, OneDimensional) {
  const Tensor t = testing::random_tensor(DType::kF32, {17}, 3);
  expect_round_trip(t.view(), DType::kF32);
}

TEST(NpyRoundTrip, ZeroElements) {
  const Tensor t(DType::kF32, {2, 0, 3}, "empty");
  expect_round_trip(t.view(), DType::kF32);
}

TEST(NpyRoundTrip, StridedAndTransposedViews) {
  const Tensor t = testing::random_tensor(DType::kF32, {4, 6}, 4);
  TensorView every_other_column = t.view();
  every_other_column.shape = {4, 3};
  every_other_column.strides = {6, 2};
  expect_round_trip(every_other_column, DType::kF32);

  TensorView transposed = t.view();
  transposed.shape = {6, 4};
  transposed.strides = {1, 6};
  expect_round_trip(transposed, DType::kF32);

  TensorView broadcast = t.view();
  broadcast.shape = {3, 6};
  broadcast.strides = {0, 1};
  expect_round_trip(broadcast, DType::kF32);
}

TEST(NpyRoundTrip, ConvertsOnWrite) {
  const Tensor t = testing::random_tensor(DType::kF64, {3, 5}, 5);
  ScratchDir dir;
  write_npy(dir / "f32.npy", t.view(), DType::kF32);
  const Tensor back = read_npy(dir / "f32.npy");
  ASSERT_EQ(back.dtype(), DType::kF32);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    EXPECT_EQ(back.data_as<float>()[i], static_cast<float>(t.data_as<double>()[i]));
  }
  expect_round_trip(back.view(), DType::kF64);
  expect_round_trip(testing::random_tensor(DType::kBool, {4}, 6).view(), DType::kF32);
}

// float16 is kept as stored: '<f2' reads into a kF16 tensor, and a kF16 tensor (or any view
// converted to it) writes '<f2', bit for bit.
TEST(NpyRoundTrip, Float16KeptAsStored) {
  Tensor all(DType::kF16, {256, 256}, "all");
  for (std::uint32_t i = 0; i < 65536; ++i) {
    all.data_as<std::uint16_t>()[i] = static_cast<std::uint16_t>(i);
  }
  expect_round_trip(all.view(), DType::kF16);
  TensorView transposed = all.view();
  transposed.strides = {1, 256};
  expect_round_trip(transposed, DType::kF16);
  expect_round_trip(all.view(), DType::kF32);  // widened on write, exactly
  const Tensor wide = testing::random_tensor(DType::kF64, {3, 5}, 7);
  expect_round_trip(wide.view(), DType::kF16);  // narrowed on write, to nearest even

  // The bytes NumPy writes for np.array([1, -2, 65504, 2**-24], dtype='<f2').
  const std::string numpy_f16 =
      npy_v1(header_for("<f2", "(4,)"), std::string("\x00\x3c\x00\xc0\xff\x7b\x01\x00", 8));
  ScratchDir dir;
  write_file(dir / "h.npy", numpy_f16);
  EXPECT_EQ(inspect_npy(dir / "h.npy").dtype, DType::kF16);
  EXPECT_EQ(inspect_npy(dir / "h.npy").bytes, 8u);
  const Tensor h = read_npy(dir / "h.npy");
  ASSERT_EQ(h.dtype(), DType::kF16);
  const double expected[4] = {1.0, -2.0, 65504.0, std::ldexp(1.0, -24)};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(testing::element(h.view(), i), expected[i]) << i;
  const std::vector<char> bytes = encode_npy(h.view(), DType::kF16);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()).substr(bytes.size() - 8),
            numpy_f16.substr(numpy_f16.size() - 8));
  EXPECT_NE(std::string(bytes.begin(), bytes.end()).find("'descr': '<f2'"), std::string::npos);
}

TEST(EncodeNpy, BFloat16IsRefusedNamingTheTensor) {
  const Tensor t = testing::random_tensor(DType::kBF16, {2}, 1);
  try {
    encode_npy(t.view(), DType::kBF16);
    ADD_FAILURE() << "bfloat16 has no .npy dtype";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "random");
    EXPECT_NE(e.problem().find("NumPy has no bfloat16"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------------------------------
// The bytes encode_npy writes.

struct Decoded {
  int major = 0;
  std::size_t preamble = 0;
  std::string header;
  std::string data;
};

Decoded decode(const std::vector<char>& bytes) {
  Decoded out;
  const std::string s(bytes.begin(), bytes.end());
  EXPECT_EQ(s.substr(0, 6), std::string("\x93NUMPY", 6));
  out.major = s[6];
  EXPECT_EQ(s[7], 0);
  out.preamble = out.major == 1 ? 10 : 12;
  std::size_t length = 0;
  for (std::size_t i = out.preamble; i-- > 8;) {
    length = length * 256 + static_cast<unsigned char>(s[i]);
  }
  out.header = s.substr(out.preamble, length);
  out.data = s.substr(out.preamble + length);
  return out;
}

TEST(EncodeNpy, HeaderLikeNumpy) {
  const Tensor t(DType::kF32, {2, 3}, "t");
  const Decoded d = decode(encode_npy(t.view(), DType::kF32));
  EXPECT_EQ(d.major, 1);
  EXPECT_EQ(d.header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u)
      << d.header;
  EXPECT_EQ((d.preamble + d.header.size()) % 64, 0u);
  EXPECT_EQ(d.header.back(), '\n');
  EXPECT_EQ(d.header.find_first_not_of(' ', d.header.find('}') + 1), d.header.size() - 1);
  EXPECT_EQ(d.data.size(), 24u);
}

TEST(EncodeNpy, ShapeTuplesAndDescrs) {
  const Tensor scalar(DType::kF64, {}, "s");
  EXPECT_NE(decode(encode_npy(scalar.view(), DType::kF64)).header.find("'shape': (), "),
            std::string::npos);
  EXPECT_NE(decode(encode_npy(scalar.view(), DType::kF64)).header.find("'descr': '<f8'"),
            std::string::npos);
  const Tensor vector(DType::kBool, {5}, "v");
  const Decoded d = decode(encode_npy(vector.view(), DType::kBool));
  EXPECT_NE(d.header.find("'shape': (5,), "), std::string::npos);
  EXPECT_NE(d.header.find("'descr': '|b1'"), std::string::npos);
  EXPECT_EQ(d.data, std::string(5, '\0'));
}

// A header over 65535 bytes needs version 2.0. No real array has such a shape (the reader
// caps the rank), but the writer must still produce a well-formed file.
TEST(EncodeNpy, Version2WhenTheHeaderIsLong) {
  const Shape shape(30000, 1);
  Tensor t(DType::kF32, shape, "t");
  const Decoded d = decode(encode_npy(t.view(), DType::kF32));
  EXPECT_EQ(d.major, 2);
  EXPECT_GT(d.header.size(), 65535u);
  EXPECT_EQ((d.preamble + d.header.size()) % 64, 0u);
  EXPECT_EQ(d.header.back(), '\n');
  EXPECT_EQ(d.data.size(), 4u);
}

// ------------------------------------------------------------------------------------------
// Files from other writers: every variant of the header a Python literal allows.

Tensor read_bytes(const std::string& bytes) {
  ScratchDir dir;
  const auto path = dir / "x.npy";
  write_file(path, bytes);
  return read_npy(path);
}

TEST(ReadNpy, KeysInAnyOrderWithDoubleQuotesAndNoTrailingComma) {
  const Tensor a =
      read_bytes(npy_v1("{'shape': (2,), 'fortran_order': False, 'descr': '<f4'}", f32_data(2)));
  EXPECT_EQ(a.shape(), Shape({2}));
  EXPECT_EQ(a.data_as<float>()[1], -0.5f);

  const Tensor b = read_bytes(npy_v1(R"({"descr": "<f8", "fortran_order": False, "shape": (1, 2)})",
                                     bytes_of<double>({1, 2})));
  EXPECT_EQ(b.dtype(), DType::kF64);
  EXPECT_EQ(b.shape(), Shape({1, 2}));
  EXPECT_EQ(b.data_as<double>()[1], 2.0);
}

TEST(ReadNpy, WhitespaceEverywhere) {
  const Tensor t = read_bytes(
      npy_v1("  {\n\t'descr' :'<f4' ,\n  'fortran_order':False,'shape':( 2 , 2 , ) ,\r\n}  ",
             f32_data(4)));
  EXPECT_EQ(t.shape(), Shape({2, 2}));
}

TEST(ReadNpy, UnpaddedHeaderAndPython2Longs) {
  const Tensor t = read_bytes(npy_file(1, 0, header_for("<f4", "(2L, 3L)"), f32_data(6), false));
  EXPECT_EQ(t.shape(), Shape({2, 3}));
  EXPECT_EQ(t.data_as<float>()[5], 1.5f);
}

TEST(ReadNpy, Version2And3) {
  const Tensor v2 = read_bytes(npy_file(2, 0, header_for("<f4", "(3,)"), f32_data(3)));
  EXPECT_EQ(v2.shape(), Shape({3}));
  EXPECT_EQ(v2.data_as<float>()[2], 0.0f);
  const Tensor v3 =
      read_bytes(npy_file(3, 0, header_for("<f8", "(2, 1)"), bytes_of<double>({7, 8})));
  EXPECT_EQ(v3.dtype(), DType::kF64);
  EXPECT_EQ(v3.shape(), Shape({2, 1}));
  EXPECT_EQ(v3.data_as<double>()[1], 8.0);
}

TEST(ReadNpy, BoolDescrs) {
  for (const char* descr : {"|b1", "<b1"}) {
    const Tensor t = read_bytes(npy_v1(header_for(descr, "(3,)"), std::string("\1\0\1", 3)));
    ASSERT_EQ(t.dtype(), DType::kBool) << descr;
    EXPECT_TRUE(t.data_as<bool>()[0]);
    EXPECT_FALSE(t.data_as<bool>()[1]);
    EXPECT_TRUE(t.data_as<bool>()[2]);
  }
}

TEST(ReadNpy, ScalarAndEmptyShapes) {
  const Tensor scalar = read_bytes(npy_v1(header_for("<f4", "( )"), f32_data(1)));
  EXPECT_EQ(scalar.shape(), Shape{});
  EXPECT_EQ(scalar.numel(), 1);
  const Tensor empty = read_bytes(npy_v1(header_for("<f8", "(4, 0)"), ""));
  EXPECT_EQ(empty.shape(), Shape({4, 0}));
  EXPECT_EQ(empty.numel(), 0);
}

TEST(ReadNpy, NonFiniteValuesAreLoaded) {
  const std::vector<float> values = {std::numeric_limits<float>::quiet_NaN(),
                                     std::numeric_limits<float>::infinity()};
  const Tensor t = read_bytes(npy_v1(header_for("<f4", "(2,)"), bytes_of(values)));
  EXPECT_TRUE(std::isnan(t.data_as<float>()[0]));
  EXPECT_TRUE(std::isinf(t.data_as<float>()[1]));
}

// ------------------------------------------------------------------------------------------
// Hostile and malformed files: each must throw qkv::Error naming the file, on one line.

void expect_read_error(const std::filesystem::path& path, const std::string& expected) {
  try {
    read_npy(path);
    ADD_FAILURE() << "read_npy accepted " << path << "; expected an error about: " << expected;
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), path.string());
    EXPECT_NE(e.problem().find(expected), std::string::npos)
        << "problem: " << e.problem() << "\nexpected it to mention: " << expected;
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

struct HostileCase {
  std::string name;
  std::string bytes;
  std::string expected;
};

void PrintTo(const HostileCase& c, std::ostream* os) { *os << c.name; }

std::vector<HostileCase> hostile_cases() {
  const std::string f4_3 = header_for("<f4", "(3,)");
  std::vector<HostileCase> cases = {
      {"EmptyFile", "", "is empty"},
      {"FiveBytesOfMagic", "\x93NUMP", "truncated"},
      {"FiveBytesOfText", "hello", "not an .npy file"},
      {"BadMagic", "\x93NUMPZ\1\0" + little_endian(10, 2) + "{}        ", "not an .npy file"},
      {"Npz", std::string("PK\3\4\x14\0\0\0", 8) + std::string(40, 'z'), ".npz archive"},
      {"EmptyNpz", std::string("PK\5\6", 4) + std::string(18, '\0'), ".npz archive"},
      {"NoVersion", "\x93NUMPY\1", "truncated"},
      {"ShortLengthField", "\x93NUMPY\2" + std::string(1, '\0') + "\x10\0", "truncated"},
      {"Version4", npy_file(4, 0, f4_3, f32_data(3)), "version 4.0"},
      {"Version1_1", npy_file(1, 1, f4_3, f32_data(3)), "version 1.1"},
      {"Version0", npy_file(0, 0, f4_3, f32_data(3)), "version 0.0"},
      {"HeaderPastEof",
       std::string("\x93NUMPY\1", 7) + std::string(1, '\0') + little_endian(1000, 2) + f4_3,
       "truncated header"},
      {"HeaderLengthHuge",
       std::string("\x93NUMPY\2", 7) + std::string(1, '\0') + little_endian(0xfffffff0, 4) + f4_3,
       "exceeds"},
      {"HeaderNotTerminated",
       npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), ", f32_data(3)),
       "end of the header"},
      {"HeaderNotADict", npy_v1("['descr', '<f4']", f32_data(3)), "expected '{'"},
      {"TextAfterDict", npy_v1(f4_3 + " x", f32_data(3)), "after the closing '}'"},
      {"MissingComma",
       npy_v1("{'descr': '<f4' 'fortran_order': False, 'shape': (3,)}", f32_data(3)),
       "expected ',' or '}'"},
      {"MissingShape", npy_v1("{'descr': '<f4', 'fortran_order': False}", ""),
       "missing key 'shape'"},
      {"MissingDescr", npy_v1("{'fortran_order': False, 'shape': (3,)}", f32_data(3)),
       "missing key 'descr'"},
      {"MissingFortranOrder", npy_v1("{'descr': '<f4', 'shape': (3,)}", f32_data(3)),
       "missing key 'fortran_order'"},
      {"UnknownKey",
       npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'extra': 1}", f32_data(3)),
       "unknown key 'extra'"},
      {"DuplicateKey",
       npy_v1("{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}",
              f32_data(3)),
       "duplicate key 'descr'"},
      {"KeyWithControlBytes",
       npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'a\x01\xff': 1}",
              f32_data(3)),
       "unknown key 'a\\x01\\xff'"},
      {"UnterminatedString", npy_v1("{'descr': '<f4, 'fortran_order': False}", ""),
       "expected ',' or '}' after the value of 'descr'"},
      {"StringRunsToEnd", npy_file(1, 0, "{'descr': '<f4", "", false), "unterminated string"},
      {"EscapeInString", npy_v1("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (3,)}", ""),
       "escape"},
      {"BigEndianF4", npy_v1(header_for(">f4", "(3,)"), f32_data(3)), "big-endian"},
      {"BigEndianF8", npy_v1(header_for(">f8", "(3,)"), f32_data(6)), "big-endian"},
      {"NativeOrderF4", npy_v1(header_for("=f4", "(3,)"), f32_data(3)), "little-endian"},
      {"Int32", npy_v1(header_for("<i4", "(3,)"), f32_data(3)), "integer dtype '<i4'"},
      {"UInt8", npy_v1(header_for("|u1", "(4,)"), "abcd"), "integer"},
      {"BigEndianF2", npy_v1(header_for(">f2", "(2,)"), "abcd"),
       "big-endian data ('>f2') is not supported; convert with .astype('<f2')"},
      {"NativeOrderF2", npy_v1(header_for("=f2", "(2,)"), "abcd"), "save it as '<f2'"},
      {"TruncatedF2", npy_v1(header_for("<f2", "(3,)"), "abcde"),
       "header claims 3 float16 values (6 bytes) but the file holds 5 bytes of data"},
      {"F2SizedAsF4", npy_v1(header_for("<f2", "(3,)"), f32_data(3)),
       "file has 6 extra bytes after the data that its header describes (3 float16 values)"},
      {"F2ByteCountOverflows", npy_v1(header_for("<f2", "(4611686018427387904,)"), "abcd"),
       "size in bytes does not fit in 64 bits"},
      {"LongDouble", npy_v1(header_for("<f16", "(1,)"), std::string(16, '\0')),
       "floating-point dtype '<f16'"},
      {"Object", npy_v1(header_for("|O", "(1,)"), std::string(8, '\0')), "object arrays"},
      {"Complex", npy_v1(header_for("<c8", "(1,)"), std::string(8, '\0')), "complex"},
      {"Unicode", npy_v1(header_for("<U5", "(1,)"), std::string(20, '\0')), "string dtype"},
      {"Datetime", npy_v1(header_for("<M8[ns]", "(1,)"), std::string(8, '\0')), "datetime"},
      {"GarbageDescr", npy_v1(header_for("zz", "(1,)"), std::string(8, '\0')),
       "unsupported dtype 'zz'"},
      {"Structured",
       npy_v1("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,)}", f32_data(3)),
       "structured"},
      {"DescrNotAString", npy_v1("{'descr': 4, 'fortran_order': False, 'shape': (3,)}", ""),
       "expected a string for 'descr'"},
      {"FortranOrder",
       npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", f32_data(4)),
       "Fortran order is not supported; save with np.ascontiguousarray"},
      {"FortranOrderNotABool",
       npy_v1("{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }", f32_data(3)),
       "True or False"},
      {"FortranOrderTrueish",
       npy_v1("{'descr': '<f4', 'fortran_order': Trueish, 'shape': (3,), }", f32_data(3)),
       "True or False"},
      {"ShapeNotATuple", npy_v1(header_for("<f4", "[3]"), f32_data(3)), "must be a tuple"},
      {"ParenthesisedInt", npy_v1(header_for("<f4", "(3)"), f32_data(3)), "is not a tuple"},
      {"NegativeDim", npy_v1(header_for("<f4", "(-1, 3)"), f32_data(3)), "negative dimension '-1'"},
      {"NonNumericDim", npy_v1(header_for("<f4", "('a', 3)"), f32_data(3)),
       "non-negative integers"},
      {"FractionalDim", npy_v1(header_for("<f4", "(2.5,)"), f32_data(3)), "non-negative integers"},
      {"DimWithLetters", npy_v1(header_for("<f4", "(3x,)"), f32_data(3)), "non-negative integers"},
      {"ShapeMissingComma", npy_v1(header_for("<f4", "(3 4)"), f32_data(12)),
       "expected ',' or ')'"},
      {"ShapeUnclosed", npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3,", ""),
       "end of the header"},
      {"DimTooLarge", npy_v1(header_for("<f4", "(99999999999999999999,)"), f32_data(3)),
       "'99999999999999999999' in 'shape' is too large"},
      {"ElementCountOverflows", npy_v1(header_for("<f4", "(4294967296, 4294967296)"), f32_data(16)),
       "element count does not fit in 64 bits"},
      {"OverflowBehindAZero", npy_v1(header_for("<f4", "(0, 4294967296, 4294967296)"), ""),
       "element count does not fit in 64 bits"},
      {"ByteCountOverflows", npy_v1(header_for("<f8", "(2305843009213693952,)"), f32_data(16)),
       "size in bytes does not fit in 64 bits"},
      {"HugeClaimedShape", npy_v1(header_for("<f4", "(1099511627776,)"), f32_data(16)),
       "header claims 1099511627776 float32 values (4 TiB) but the file holds 64 bytes of data"},
      {"TruncatedData", npy_v1(f4_3, f32_data(3).substr(0, 11)),
       "header claims 3 float32 values (12 bytes) but the file holds 11 bytes of data"},
      {"TrailingBytes", npy_v1(f4_3, f32_data(3) + "xyz"), "file has 3 extra bytes"},
      {"BoolByteTwo", npy_v1(header_for("|b1", "(3,)"), std::string("\1\2\0", 3)),
       "bool element 1 holds the byte 2"},
      {"BoolByte255", npy_v1(header_for("|b1", "(2,)"), std::string("\0\xff", 2)),
       "holds the byte 255"},
  };
  std::string many_dims = "(";
  for (int i = 0; i < 65; ++i) many_dims += "1, ";
  cases.push_back({"TooManyDims", npy_v1(header_for("<f4", many_dims + ")"), f32_data(1)),
                   "more than 64 dimensions"});
  return cases;
}

class HostileNpy : public ::testing::TestWithParam<HostileCase> {};

TEST_P(HostileNpy, IsRejectedNamingTheFile) {
  ScratchDir dir;
  const auto path = dir / "hostile.npy";
  write_file(path, GetParam().bytes);
  expect_read_error(path, GetParam().expected);
}

INSTANTIATE_TEST_SUITE_P(All, HostileNpy, ::testing::ValuesIn(hostile_cases()),
                         [](const ::testing::TestParamInfo<HostileCase>& param_info) {
                           return param_info.param.name;
                         });

// Random damage to valid files: every outcome must be a tensor or a one-line qkv::Error, never
// a crash, a sanitizer report or another exception.
TEST(ReadNpy, DamagedFilesFailCleanly) {
  const std::vector<std::string> originals = {
      npy_v1(header_for("<f4", "(2, 3)"), f32_data(6)),
      npy_v1(header_for("|b1", "(4,)"), std::string("\1\0\1\1", 4)),
      npy_file(2, 0, header_for("<f8", "(1,)"), bytes_of<double>({1.0})),
  };
  std::mt19937 rng(12345);
  ScratchDir dir;
  const auto path = dir / "damaged.npy";
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = originals[static_cast<std::size_t>(trial) % originals.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes[at] = "0123456789(),'\" {}:-"[rng() % 21];
          break;
        case 2:
          bytes.resize(at);
          break;
        default:
          bytes.insert(at, 1, static_cast<char>(rng()));
          break;
      }
      if (bytes.empty()) break;
    }
    write_file(path, bytes);
    try {
      const Tensor t = read_npy(path);
      ++accepted;
      if (t.dtype() == DType::kBool) {
        const auto* raw = static_cast<const unsigned char*>(t.data());
        for (std::size_t i = 0; i < t.nbytes(); ++i) ASSERT_LE(raw[i], 1) << "trial " << trial;
      }
    } catch (const Error& e) {
      EXPECT_EQ(e.subject(), path.string());
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  // Some damage (inside the data, or to padding) leaves a valid file.
  EXPECT_GT(accepted, 0);
}

TEST(ReadNpy, MissingFile) {
  ScratchDir dir;
  expect_read_error(dir / "absent.npy", "cannot open: No such file or directory");
}

TEST(ReadNpy, Directory) {
  ScratchDir dir;
  expect_read_error(dir.path(), "Is a directory");
}

TEST(ReadNpy, HugeClaimFailsFastWithoutAllocating) {
  // (2^62,) of float32 bytes overflows, so use the largest claim that does not: reading must
  // fail on the size check, never by trying to allocate it.
  ScratchDir dir;
  const auto path = dir / "huge.npy";
  write_file(path, npy_v1(header_for("<f4", "(2305843009213693951,)"), f32_data(2)));
  expect_read_error(path, "(8 EiB) but the file holds 8 bytes of data");
}

TEST(EncodeNpy, RawLittleEndianDataAfterAnAlignedHeader) {
  ScratchDir dir;
  Tensor t(DType::kF32, {3}, "t");
  for (int i = 0; i < 3; ++i) t.data_as<float>()[i] = static_cast<float>(i) * 0.5f - 1.0f;
  write_npy(dir / "a.npy", t.view(), DType::kF32);
  const std::string written = read_file(dir / "a.npy");
  EXPECT_EQ(written.substr(written.size() - 12), f32_data(3));
  EXPECT_EQ(written.size() % 64, 12u);
}

}  // namespace
}  // namespace qkv
