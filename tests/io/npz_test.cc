// read_npz_tensor, inspect_npz_tensor, list_npz and FILE.npz:NAME in read_tensor: archives
// written by np.savez and np.savez_compressed (tests/hostile/legal) and by libzip here, read bit
// for bit as the same arrays saved as .npy; and every hostile archive of tests/hostile/npz
// refused with its own one-line message naming the file (and the member, where it is one).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
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

namespace fs = std::filesystem;

using testing::NpzMember;
using testing::ScratchDir;
using testing::write_npz;

const fs::path kCorpus = fs::path(QKV_HOSTILE_DIR);

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// The error's text, which must be one line.
std::string refusal(const std::function<void()>& read) {
  try {
    read();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "not refused";
  return "";
}

TEST(Npz, StoredAndDeflatedMembersReadAsTheSameBitsAsNpy) {
  ScratchDir dir;
  const Tensor q = testing::random_tensor(DType::kF32, {5, 7}, 1);
  const Tensor k = testing::random_tensor(DType::kF64, {2, 3, 4}, 2);
  const Tensor m = testing::random_tensor(DType::kF32, {0, 3}, 3);
  Tensor half = testing::random_tensor(DType::kF32, {9}, 4);
  write_npy(dir / "q.npy", q.view(), DType::kF32);
  write_npy(dir / "k.npy", k.view(), DType::kF64);
  write_npy(dir / "m.npy", m.view(), DType::kF32);
  write_npy(dir / "h.npy", half.view(), DType::kF16);
  for (const bool deflate : {false, true}) {
    const fs::path path = dir / (deflate ? "c.npz" : "s.npz");
    write_npz(path, {{"q.npy", encode_npy(q.view(), DType::kF32), deflate},
                     {"k.npy", encode_npy(k.view(), DType::kF64), deflate},
                     {"m.npy", encode_npy(m.view(), DType::kF32), deflate},
                     {"h.npy", encode_npy(half.view(), DType::kF16), deflate}});
    for (const char* name : {"q", "k", "m", "h"}) {
      SCOPED_TRACE(path.string() + ":" + name);
      const Tensor from_npy = read_npy(dir / (std::string(name) + ".npy"));
      const Tensor from_npz = read_tensor(path.string() + ":" + name);
      EXPECT_TRUE(same_bits(from_npz, from_npy));
      EXPECT_EQ(from_npz.name(), path.string() + ":" + name);
      // NAME.npy names the same member.
      EXPECT_TRUE(same_bits(read_npz_tensor(path, std::string(name) + ".npy"), from_npy));
      const TensorInfo info = inspect_tensor(path.string() + ":" + name);
      EXPECT_EQ(info.dtype, from_npy.dtype());
      EXPECT_EQ(info.shape, from_npy.shape());
      EXPECT_EQ(info.bytes, from_npy.nbytes());
      EXPECT_EQ(info.name, path.string() + ":" + name);
    }
    std::vector<std::string> names = list_npz(path);
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"h", "k", "m", "q"}));
  }
}

TEST(Npz, NumpysOwnArchivesRead) {
  // make_npz_corpus.py: q = (arange(12) - 5) / 4 as float32 [3, 4], k = v = ones [8, 4].
  for (const char* file : {"npz_savez.npz", "npz_savez_compressed.npz"}) {
    SCOPED_TRACE(file);
    const fs::path path = kCorpus / "legal" / file;
    const Tensor q = read_tensor(path.string() + ":q");
    ASSERT_EQ(q.shape(), (Shape{3, 4}));
    ASSERT_EQ(q.dtype(), DType::kF32);
    for (std::int64_t i = 0; i < 12; ++i) {
      EXPECT_EQ(testing::element(q.view(), i), (static_cast<double>(i) - 5) / 4) << i;
    }
    const Tensor k = read_tensor(path.string() + ":k");
    EXPECT_EQ(k.shape(), (Shape{8, 4}));
    std::vector<std::string> names = list_npz(path);
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"k", "q", "v"}));
  }
  // A member named without .npy is read by its own name, as np.load reads it.
  EXPECT_EQ(
      read_tensor((kCorpus / "legal" / "npz_member_without_suffix.npz").string() + ":q").shape(),
      (Shape{2, 4}));
}

// Every file of tests/hostile/npz: the problem its message must state, and whether the message
// names the member (PATH:q) or the archive as a whole (PATH).
struct Expected {
  bool member;
  const char* says;
};

const std::map<std::string, Expected>& expected_refusals() {
  static const std::map<std::string, Expected> table = {
      {"not_a_zip", {false, "is not an .npz archive: no zip central directory"}},
      {"empty", {false, "is empty (0 bytes), not an .npz archive"}},
      {"local_header_only", {false, "is not an .npz archive: no zip central directory"}},
      {"truncated_central_directory", {false, "is not an .npz archive: no zip central directory"}},
      {"end_record_only_no_arrays", {false, "has no array named 'q'; the archive holds no arrays"}},
      {"no_member_q", {false, "has no array named 'q'; the archive holds 2 arrays: 'k', 'v'"}},
      {"bomb_claims_4gib", {true, "more than deflate can produce (at most 1032 to 1): a zip bomb"}},
      {"bomb_zip64_claims_1tib", {true, "declares 1099511627776 bytes (1 TiB) from 76 compressed"}},
      {"bomb_inflates_past_declared_size",
       {true, "the member inflates to more than the 160 bytes its zip entry declares"}},
      {"stream_shorter_than_declared",
       {true, "the member's data ends after 160 bytes but its zip entry declares 1048704"}},
      {"bad_crc_stored", {true, "the member's data fails its CRC-32 check"}},
      {"bad_crc_deflated", {true, "the member's data fails its CRC-32 check"}},
      {"deflate_garbage", {true, "the member's compressed data is invalid"}},
      {"stored_size_mismatch", {true, "the stored member declares 1160 bytes but 160 bytes"}},
      {"name_dotdot", {false, "has no array named 'q'; the archive holds 1 array: 'k'"}},
      {"name_absolute", {false, "has no array named 'q'; the archive holds no arrays"}},
      {"name_in_folder", {false, "has no array named 'q'; the archive holds no arrays"}},
      {"name_control_characters", {false, "has no array named 'q'; the archive holds 1 array: 'q"}},
      {"duplicate_names", {false, "holds the member name 'q.npy' more than once"}},
      {"name_nul_shadows_member",
       {false,
        "the member name 'q.npy\\x00zz' holds a NUL byte (np.load would read it as "
        "'q.npy'): refused as ambiguous"}},
      {"name_npy_beside_bare_name",
       {false,
        "holds the members 'q' and 'q.npy', both the array 'q' to np.load (which drops "
        ".npy): refused as ambiguous"}},
      {"overlapping_local_headers",
       {false, "local header disagrees with its central directory entry"}},
      {"entry_overlaps_central_directory",
       {false, "a member's data runs into the central directory"}},
      {"local_header_disagrees",
       {false, "local header disagrees with its central directory entry"}},
      {"eocd_claims_65535_entries", {false, "is not a valid zip archive"}},
      {"multi_disk", {false, "is a multi-disk zip archive"}},
      {"zip64_claims_2pow40_entries", {false, "is not a valid zip archive"}},
      {"zip64_central_directory_1pib", {false, "is not a valid zip archive"}},
      {"encrypted", {true, "the member is encrypted"}},
      {"method_bzip2", {true, "compressed with zip method 12 (bzip2)"}},
      {"method_lzma", {true, "compressed with zip method 14 (LZMA)"}},
      {"method_deflate64", {true, "compressed with zip method 9 (deflate64)"}},
      {"member_not_npy", {true, "not an .npy file"}},
      {"member_npy_claims_more", {true, "header claims 1000000 float32 values"}},
      {"member_npy_big_endian", {true, "big-endian data ('>f4') is not supported"}},
      {"member_npy_int64", {true, "integer dtype '<i8' is not supported"}},
      {"member_is_npz", {true, "is an .npz archive, not an .npy file"}},
  };
  return table;
}

TEST(Npz, EveryHostileArchiveIsRefusedInOneLineNamingFileAndMember) {
  std::size_t seen = 0;
  for (const auto& entry : fs::directory_iterator(kCorpus / "npz")) {
    const fs::path path = entry.path();
    const std::string stem = path.stem().string();
    SCOPED_TRACE(path.filename().string());
    // NaN data is read: refusing it is attention's validation (the CLI test covers it).
    if (stem == "member_npy_nan") {
      EXPECT_EQ(read_npz_tensor(path, "q").shape(), (Shape{2, 4}));
      continue;
    }
    const auto found = expected_refusals().find(stem);
    ASSERT_NE(found, expected_refusals().end()) << "no expected message for this file";
    ++seen;
    const std::string prefix = path.string() + (found->second.member ? ":q: " : ": ");
    for (const bool peek : {false, true}) {
      // The peek reads the header alone: what only the data shows passes it.
      const bool shown_by_data = stem.starts_with("bad_crc") ||
                                 stem == "bomb_inflates_past_declared_size" ||
                                 stem == "stream_shorter_than_declared";
      if (peek && shown_by_data) continue;
      const std::string what = refusal([&] {
        if (peek) {
          inspect_tensor(path.string() + ":q");
        } else {
          read_tensor(path.string() + ":q");
        }
      });
      EXPECT_TRUE(what.starts_with(prefix)) << what;
      EXPECT_NE(what.find(found->second.says), std::string::npos) << what;
    }
  }
  EXPECT_EQ(seen, expected_refusals().size());
}

TEST(Npz, HeaderOnlyPeekLeavesDataChecksToTheRead) {
  // member_npy_claims_more's header is read before its data: the peek is refused by the same
  // size check as the read, since the entry declares fewer bytes than the header describes.
  const fs::path path = kCorpus / "npz" / "member_npy_claims_more.npz";
  EXPECT_NE(refusal([&] { inspect_npz_tensor(path, "q"); }).find("header claims"),
            std::string::npos);
  // The stream that goes on past its declared size has an honest header: the peek sees a
  // [2, 4] float32 tensor, the read refuses.
  const fs::path past = kCorpus / "npz" / "bomb_inflates_past_declared_size.npz";
  EXPECT_EQ(inspect_npz_tensor(past, "q").shape, (Shape{2, 4}));
}

TEST(Npz, NamesThatAreNotFlatNameNothing) {
  const fs::path path = kCorpus / "legal" / "npz_savez.npz";
  for (const char* name : {"../q", "/q", "a/q", "..", ".", "q\\x"}) {
    SCOPED_TRACE(name);
    const std::string what = refusal([&] { read_npz_tensor(path, name); });
    EXPECT_TRUE(what.starts_with(path.string() + ":")) << what;
    EXPECT_NE(what.find("names no member"), std::string::npos) << what;
  }
}

// An archive in which np.load reads two members as one array is refused whichever array is
// asked for, and by list_npz: FILE.npz:q must never mean one member to qkv and another to NumPy.
TEST(Npz, MembersNumpyReadsAsOneArrayAreRefusedWhicheverIsAsked) {
  ScratchDir dir;
  const Tensor q = testing::random_tensor(DType::kF32, {2, 3}, 1);
  const fs::path path = dir / "ambiguous.npz";
  write_npz(path, {{"q.npy", encode_npy(q.view(), DType::kF32), false},
                   {"k", encode_npy(q.view(), DType::kF32), true},
                   {"k.npy", encode_npy(q.view(), DType::kF32), false}});
  const std::string says = path.string() +
                           ": holds the members 'k' and 'k.npy', both the array 'k' to np.load "
                           "(which drops .npy): refused as ambiguous";
  EXPECT_EQ(refusal([&] { read_npz_tensor(path, "q"); }), says);
  EXPECT_EQ(refusal([&] { inspect_tensor(path.string() + ":k"); }), says);
  EXPECT_EQ(refusal([&] { list_npz(path); }), says);
  // A real space is no NUL: the raw names are read, and the array is.
  const fs::path spaced = dir / "spaced.npz";
  write_npz(spaced, {{"my q.npy", encode_npy(q.view(), DType::kF32), true},
                     {"k.npy", encode_npy(q.view(), DType::kF32), false}});
  EXPECT_TRUE(same_bits(read_npz_tensor(spaced, "my q"), q));
}

TEST(Npz, SpecsWithoutANameAreRefused) {
  EXPECT_NE(refusal([] { read_tensor("a.npz"); }).find("name the array as a.npz:NAME"),
            std::string::npos);
  EXPECT_NE(refusal([] { read_tensor("a.npz:"); }).find("write FILE.npz:NAME"), std::string::npos);
  // The first marker ends the file name: a safetensors tensor may be called "x.npz:y".
  EXPECT_NE(refusal([] {
              read_tensor("missing.safetensors:x.npz:y");
            }).find("missing.safetensors: cannot open"),
            std::string::npos);
  EXPECT_NE(refusal([] { read_tensor("missing.npz:x"); }).find("missing.npz: cannot open"),
            std::string::npos);
}

TEST(Npz, AFifoIsRefusedWithoutBlocking) {
  ScratchDir dir;
  const fs::path fifo = dir / "f.npz";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(refusal([&] {
              read_tensor(fifo.string() + ":q");
            }).find("cannot read: not a regular file (a FIFO)"),
            std::string::npos);
}

TEST(Npz, ABoolMemberHoldingAByteOtherThan0Or1IsRefused) {
  ScratchDir dir;
  Tensor mask(DType::kBool, {4}, "m");
  std::memset(mask.data(), 1, 4);
  std::vector<char> bytes = encode_npy(mask.view(), DType::kBool);
  bytes.back() = 2;
  write_npz(dir / "m.npz", {{"m.npy", bytes, true}});
  const std::string what = refusal([&] { read_tensor((dir / "m.npz").string() + ":m"); });
  EXPECT_NE(what.find("m.npz:m: bool element 3 holds the byte 2"), std::string::npos) << what;
}

}  // namespace
}  // namespace qkv
