// read_safetensors_tensor, list_safetensors and read_tensor: round trips in every dtype qkv
// reads (F16 and BF16 kept as stored, bit for bit), what the format tolerates, and a hostile set
// in which every file must be refused with an error naming the file.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "io/safetensors_builder.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/tensor.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using testing::safetensors_bytes;
using testing::safetensors_item;
using testing::SafetensorsItem;
using testing::ScratchDir;

std::string le64(std::uint64_t value) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return out;
}

// A file of the given header text (not padded) and data.
std::string raw_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

TEST(Safetensors, RoundTripsEveryDtype) {
  ScratchDir dir;
  const Tensor a = testing::random_tensor(DType::kF32, {3, 5}, 1);
  const Tensor b = testing::random_tensor(DType::kF64, {2, 2, 3}, 2);
  const Tensor c = testing::random_tensor(DType::kF32, {7}, 3);
  const Tensor d = testing::random_tensor(DType::kF32, {4, 2}, 4);
  testing::write_bytes(
      dir / "m.safetensors",
      safetensors_bytes({safetensors_item("a", a, "F32"), safetensors_item("layer.0.b", b, "F64"),
                         safetensors_item("c", c, "F16"), safetensors_item("d", d, "BF16")},
                        R"({"format":"pt"})"));
  const std::string path = (dir / "m.safetensors").string();

  const Tensor ra = read_safetensors_tensor(path, "a");
  EXPECT_EQ(ra.name(), path + ":a");
  EXPECT_EQ(ra.dtype(), DType::kF32);
  EXPECT_EQ(ra.shape(), a.shape());
  EXPECT_EQ(testing::max_abs_diff(ra.view(), a.view()), 0.0);

  const Tensor rb = read_tensor(path + ":layer.0.b");
  EXPECT_EQ(rb.dtype(), DType::kF64);
  EXPECT_EQ(testing::max_abs_diff(rb.view(), b.view()), 0.0);

  // F16 and BF16 are kept as stored: the values written (c and d rounded to nearest even by the
  // builder), bit for bit, with their 16-bit size in memory.
  const Tensor rc = read_tensor(path + ":c");
  EXPECT_EQ(rc.dtype(), DType::kF16);
  EXPECT_EQ(rc.nbytes(), 7u * 2);
  EXPECT_EQ(inspect_tensor(path + ":c").dtype, DType::kF16);
  EXPECT_EQ(inspect_tensor(path + ":c").bytes, 7u * 2);
  EXPECT_EQ(testing::max_abs_diff(rc.view(), c.to(DType::kF16).view()), 0.0);
  EXPECT_LE(testing::max_abs_diff(rc.view(), c.view()), 1.0 / 2048);  // half: 11-bit mantissa
  const Tensor rd = read_tensor(path + ":d");
  EXPECT_EQ(rd.dtype(), DType::kBF16);
  EXPECT_EQ(inspect_tensor(path + ":d").dtype, DType::kBF16);
  EXPECT_EQ(testing::max_abs_diff(rd.view(), d.to(DType::kBF16).view()), 0.0);
  EXPECT_LE(testing::max_abs_diff(rd.view(), d.view()), 1.0 / 256);  // bfloat16: 8 bits

  const std::vector<SafetensorsEntry> entries = list_safetensors(path);
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].name, "a");
  EXPECT_EQ(entries[1].name, "layer.0.b");
  EXPECT_EQ(entries[1].dtype, "F64");
  EXPECT_EQ(entries[1].shape, (Shape{2, 2, 3}));
  EXPECT_EQ(entries[1].begin, 60u);
  EXPECT_EQ(entries[1].end, 60u + 96u);

  // Every tensor at once, in the entries' order, each as read_safetensors_tensor reads it.
  const std::vector<std::pair<std::string, Tensor>> all = read_safetensors(path);
  ASSERT_EQ(all.size(), entries.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(entries[i].name);
    EXPECT_EQ(all[i].first, entries[i].name);
    const Tensor one = read_safetensors_tensor(path, entries[i].name);
    EXPECT_EQ(all[i].second.name(), one.name());
    EXPECT_EQ(all[i].second.dtype(), one.dtype());
    EXPECT_EQ(all[i].second.shape(), one.shape());
    EXPECT_EQ(std::memcmp(all[i].second.data(), one.data(), one.nbytes()), 0);
  }
}

TEST(Safetensors, ReadingEveryTensorRefusesTheFileForOneItCannotRead) {
  ScratchDir dir;
  testing::write_bytes(dir / "i.safetensors",
                       raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                R"("n":{"dtype":"I64","shape":[1],"data_offsets":[4,12]}})",
                                std::string(12, '\0')));
  const std::string path = (dir / "i.safetensors").string();
  try {
    (void)read_safetensors(path);
    ADD_FAILURE() << "an I64 tensor was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), path + ":n");
    EXPECT_NE(e.problem().find("I64"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)read_safetensors((dir / "missing.safetensors").string()), Error);
}

TEST(Safetensors, HalfValuesAreExactForEveryBitPattern) {
  // Every binary16 value, kept as stored and widened (Tensor::to), equals
  // (-1)^s · 2^(e-15) · (1 + m/1024) (or the subnormal, infinite and NaN cases), computed here
  // in double; the stored bits are the file's.
  std::string bytes;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto v = static_cast<std::uint16_t>(h);
    bytes.append(reinterpret_cast<const char*>(&v), 2);
  }
  ScratchDir dir;
  testing::write_bytes(
      dir / "h.safetensors",
      safetensors_bytes({{"h", "F16", {65536}, bytes, ""}, {"b", "BF16", {65536}, bytes, ""}}));
  const Tensor half16 = read_safetensors_tensor(dir / "h.safetensors", "h");
  const Tensor bf16 = read_safetensors_tensor(dir / "h.safetensors", "b");
  ASSERT_EQ(half16.dtype(), DType::kF16);
  ASSERT_EQ(bf16.dtype(), DType::kBF16);
  ASSERT_EQ(std::memcmp(half16.data(), bytes.data(), bytes.size()), 0);
  ASSERT_EQ(std::memcmp(bf16.data(), bytes.data(), bytes.size()), 0);
  const Tensor half = half16.to(DType::kF32);
  const Tensor bf = bf16.to(DType::kF32);
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    const int e = static_cast<int>((h >> 10) & 0x1fu);
    const double m = static_cast<double>(h & 0x3ffu);
    const float got = half.data_as<float>()[h];
    if (e == 31) {
      if (m == 0) {
        EXPECT_EQ(got, static_cast<float>(sign * std::numeric_limits<double>::infinity())) << h;
      } else {
        EXPECT_TRUE(std::isnan(got)) << h;
      }
      continue;
    }
    const double expected =
        e == 0 ? sign * std::ldexp(m, -24) : sign * std::ldexp(1.0 + m / 1024.0, e - 15);
    ASSERT_EQ(static_cast<double>(got), expected) << "half 0x" << std::hex << h;
    EXPECT_EQ(std::signbit(got), (h & 0x8000u) != 0) << h;
    // bfloat16 is the upper half of a float32.
    const float bexpected = std::bit_cast<float>(h << 16);
    const float bgot = bf.data_as<float>()[h];
    if (std::isnan(bexpected)) {
      EXPECT_TRUE(std::isnan(bgot));
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(bgot), h << 16) << h;
    }
  }
}

TEST(Safetensors, ToleratesWhatTheFormatAllows) {
  ScratchDir dir;
  // Header padded with spaces, metadata, a scalar, a zero-size tensor, tensors listed out of
  // offset order, a bool tensor, and a dtype qkv does not read (listed, not loaded).
  std::string data(4, '\0');
  const float one = 1.0f;
  std::memcpy(data.data(), &one, 4);
  data += std::string("\x01\x00\x01", 3);
  data += std::string(8, '\x07');
  const std::string header = R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                             R"("i":{"dtype":"I64","shape":[1],"data_offsets":[7,15]},)"
                             R"("__metadata__":{"format":"pt","note":"x"},)"
                             R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[4,7]},)"
                             R"("empty":{"dtype":"F16","shape":[0,3],"data_offsets":[4,4]}}    )";
  testing::write_bytes(dir / "t.safetensors", raw_file(header, data));
  const auto path = dir / "t.safetensors";
  const Tensor s = read_safetensors_tensor(path, "s");
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.data_as<float>()[0], 1.0f);
  const Tensor m = read_safetensors_tensor(path, "m");
  EXPECT_EQ(m.dtype(), DType::kBool);
  EXPECT_TRUE(m.data_as<bool>()[0]);
  EXPECT_FALSE(m.data_as<bool>()[1]);
  EXPECT_EQ(read_safetensors_tensor(path, "empty").shape(), (Shape{0, 3}));
  EXPECT_EQ(list_safetensors(path).size(), 4u);
  try {
    read_safetensors_tensor(path, "i");
    FAIL() << "I64 was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), path.string() + ":i");
    EXPECT_NE(e.problem().find("I64"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, SpecsNameAFileAndATensor) {
  ScratchDir dir;
  const Tensor a = testing::random_tensor(DType::kF32, {2, 3}, 5);
  testing::write_bytes(dir / "w.safetensors",
                       safetensors_bytes({safetensors_item("h.0.attn.c_attn.weight", a, "F32")}));
  write_npy(dir / "a.npy", a.view(), DType::kF32);
  const std::string st = (dir / "w.safetensors").string();
  EXPECT_EQ(read_tensor((dir / "a.npy").string()).shape(), (Shape{2, 3}));
  EXPECT_EQ(read_tensor(st + ":h.0.attn.c_attn.weight").shape(), (Shape{2, 3}));

  const auto error_of = [](const std::string& spec) {
    try {
      read_tensor(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(st).find(st + ":NAME"), std::string::npos) << error_of(st);
  EXPECT_NE(error_of(st + ":").find("names no tensor"), std::string::npos);
  // A missing prefix is suggested.
  EXPECT_NE(error_of(st + ":c_attn.weight").find("did you mean 'h.0.attn.c_attn.weight'"),
            std::string::npos)
      << error_of(st + ":c_attn.weight");
  EXPECT_NE(error_of(st + ":nope").find("the file holds 1 tensor: 'h.0.attn.c_attn.weight'"),
            std::string::npos)
      << error_of(st + ":nope");
  EXPECT_NE(error_of((dir / "missing.safetensors").string() + ":x").find("cannot open"),
            std::string::npos);
}

// ------------------------------------------------------------------------------------------
// Hostile files: each must throw qkv::Error whose subject is the file and whose message says
// what is wrong, before any large allocation.

struct HostileCase {
  const char* name;
  std::string bytes;
  const char* expect;  // a phrase of the message
};

std::string good_entry(const std::string& name, std::uint64_t begin, std::uint64_t end,
                       const std::string& shape = "[1]") {
  return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

std::vector<HostileCase> hostile_cases() {
  const std::string four(4, '\0');
  const std::string eight(8, '\0');
  std::string many_ones = "[1";
  for (int i = 0; i < 64; ++i) many_ones += ",1";
  many_ones += "]";
  return {
      {"empty", "", "too short"},
      {"short_length", std::string("\x10\x00\x00", 3), "too short"},
      {"huge_header_length", le64(std::uint64_t{1} << 40) + "{}", "exceeds the limit"},
      {"max_header_length", le64(~std::uint64_t{0}) + "{}", "exceeds the limit"},
      {"header_past_end", le64(100) + "{}", "truncated header"},
      {"zero_header", le64(0), "empty header"},
      {"not_json_object", raw_file("[1,2]", ""), "start with '{'"},
      {"npy_file", std::string("\x93NUMPY\x01\x00", 8) + "{'descr'", "exceeds the limit"},
      {"bad_json", raw_file("{\"a\":{\"dtype\":\"F32\",", ""), "malformed JSON header"},
      {"trailing_garbage", raw_file("{} x", ""), "malformed JSON header"},
      {"nul_then_garbage", raw_file(std::string("{}\0{\"a\"", 6), ""), "NUL byte at byte 2"},
      {"nul_padding", raw_file(std::string("{}  \0\0", 6), ""), "NUL byte at byte 4"},
      {"newline_after_json", raw_file("{}\n  ", ""), "'\\x0a' at byte 2"},
      {"second_json_value", raw_file("{} {}", ""), "malformed JSON header at byte 4"},
      {"invalid_utf8", raw_file("{\"\xff\xfe\":{}}", ""), "malformed JSON header"},
      {"entry_not_object", raw_file("{\"a\":[1]}", ""), "must map to an object"},
      {"missing_dtype", raw_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", four),
       "has no 'dtype'"},
      {"missing_shape", raw_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", four),
       "has no 'shape'"},
      {"missing_offsets", raw_file(R"({"a":{"dtype":"F32","shape":[1]}})", four),
       "has no 'data_offsets'"},
      {"unknown_dtype", raw_file(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", four),
       "unknown dtype 'F33'"},
      {"dtype_number", raw_file(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", four),
       "'dtype' must be a string"},
      {"negative_dim", raw_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four),
       "negative number"},
      {"float_dim", raw_file(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", four),
       "'1.5'"},
      {"huge_dim",
       raw_file(R"({"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}})",
                four),
       "not a non-negative integer within 64 bits"},
      {"dim_over_int64",
       raw_file(R"({"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})",
                four),
       "too large for a 64-bit signed integer"},
      {"three_offsets",
       raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", four),
       "exactly two"},
      {"one_offset", raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", four),
       "exactly two"},
      {"end_before_begin",
       raw_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", four),
       "end before they begin"},
      {"gap", raw_file("{" + good_entry("a", 4, 8) + "}", eight), "gap of 4 bytes"},
      {"overlap", raw_file("{" + good_entry("a", 0, 4) + "," + good_entry("b", 2, 6) + "}", eight),
       "overlaps tensor 'a'"},
      {"size_mismatch", raw_file("{" + good_entry("a", 0, 8) + "}", eight), "needs 4 bytes"},
      {"past_end", raw_file("{" + good_entry("a", 0, 4) + "," + good_entry("b", 4, 8) + "}", four),
       "past the end of the file"},
      {"extra_bytes", raw_file("{" + good_entry("a", 0, 4) + "}", eight),
       "4 bytes after the last tensor"},
      {"numel_overflow",
       raw_file("{" + good_entry("a", 0, 4, "[4294967296,4294967296,16]") + "}", four),
       "overflows 64 bits"},
      {"bytes_overflow",
       raw_file("{" + good_entry("a", 0, 4, "[4611686018427387904,2]") + "}", four),
       "overflows 64 bits"},
      {"duplicate_name",
       raw_file("{" + good_entry("a", 0, 4) + "," + good_entry("a", 4, 8) + "}", eight),
       "more than once"},
      {"unknown_key",
       raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", four),
       "unknown key 'x'"},
      {"metadata_nested", raw_file(R"({"__metadata__":{"a":{"b":"c"}}})", ""),
       "values must be strings"},
      {"metadata_number", raw_file(R"({"__metadata__":{"a":1}})", ""), "values must be strings"},
      {"deep_nesting", raw_file("{\"a\":{\"shape\":[[[[[[[[[[[[[[]]]]]]]]]]]]]]}}", ""),
       "must hold non-negative integers"},
      {"too_many_dims", raw_file("{" + good_entry("a", 0, 4, many_ones) + "}", four),
       "more than 64 dimensions"},
      {"misaligned_f4",
       raw_file(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", std::string(1, '\0')),
       "whole number of bytes"},
      {"null_value", raw_file(R"({"a":null})", ""), "must map to an object"},
  };
}

TEST(SafetensorsHostile, EveryFileIsRefusedNamingIt) {
  ScratchDir dir;
  int refused = 0;
  for (const HostileCase& c : hostile_cases()) {
    SCOPED_TRACE(c.name);
    const auto path = dir / (std::string(c.name) + ".safetensors");
    testing::write_bytes(path, c.bytes);
    try {
      list_safetensors(path);
      read_safetensors_tensor(path, "a");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.subject(), path.string());
      EXPECT_NE(e.problem().find(c.expect), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
      ++refused;
    }
  }
  EXPECT_GE(refused, 30);
}

TEST(SafetensorsHostile, BoolBytesMustBeZeroOrOne) {
  ScratchDir dir;
  testing::write_bytes(dir / "b.safetensors",
                       safetensors_bytes({{"m", "BOOL", {3}, std::string("\x01\x02\x00", 3), ""}}));
  try {
    read_safetensors_tensor(dir / "b.safetensors", "m");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.problem().find("holds the byte 2"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsHostile, NamesWithLineBreaksStayOnOneLine) {
  ScratchDir dir;
  // JSON "\n" in a name: the reader's messages escape it.
  testing::write_bytes(dir / "n.safetensors",
                       raw_file(R"({"bad\nname":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                                std::string(8, '\0')));
  const std::vector<SafetensorsEntry> entries = list_safetensors(dir / "n.safetensors");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].name, "bad\nname");
  for (const std::string& name : {std::string("bad\nname"), std::string("other\rname")}) {
    try {
      read_safetensors_tensor(dir / "n.safetensors", name);
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find_first_of("\n\r"), std::string::npos) << e.what();
    }
  }
}

TEST(SafetensorsHostile, LongHeaderIsReadWithinItsBound) {
  // A header of 1 MiB of padding after a valid object is accepted; one that claims 100 MB + 1
  // is refused before reading.
  ScratchDir dir;
  std::string header = "{" + good_entry("a", 0, 4) + "}";
  header.append(std::size_t{1} << 20, ' ');
  testing::write_bytes(dir / "pad.safetensors", raw_file(header, std::string(4, '\0')));
  EXPECT_EQ(read_safetensors_tensor(dir / "pad.safetensors", "a").numel(), 1);
  testing::write_bytes(dir / "big.safetensors", le64(100'000'001) + "{}");
  EXPECT_THROW(list_safetensors(dir / "big.safetensors"), Error);
}

// encode_safetensors writes what read_safetensors reads back, bit for bit and in order.
TEST(Safetensors, EncodeRoundTrips) {
  ScratchDir dir;
  const Tensor a = testing::random_tensor(DType::kF32, {3, 5}, 11);
  const Tensor b = testing::random_tensor(DType::kF64, {2, 3}, 12);
  const Tensor c = testing::random_tensor(DType::kF32, {7}, 13);
  OutputFiles out;
  out.stage(dir / "w.safetensors",
            encode_safetensors({{"layer0.wq", a.view()}, {"b", b.view()}, {"c", c.view()}}));
  out.commit();
  const auto back = read_safetensors(dir / "w.safetensors");
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].first, "layer0.wq");
  EXPECT_EQ(back[1].first, "b");
  const Tensor* want[] = {&a, &b, &c};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back[i].second.shape(), want[i]->shape());
    EXPECT_EQ(back[i].second.dtype(), want[i]->dtype());
    EXPECT_EQ(std::memcmp(back[i].second.data(), want[i]->data(), want[i]->nbytes()), 0);
  }
  EXPECT_THROW(encode_safetensors({{"x", a.view()}, {"x", c.view()}}), Error);
}

}  // namespace
}  // namespace qkv
