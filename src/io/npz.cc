// NumPy .npz archives (np.savez, np.savez_compressed): one array read out of a zip archive.
//
// The format. An .npz file is a zip archive whose members are .npy files, one per array,
// named NAME.npy: np.savez stores them (method 0), np.savez_compressed deflates them (method 8).
// NumPy writes every member with a zip64 extra field. `FILE.npz:NAME` reads member NAME.npy (or
// NAME itself, when the archive has a member of exactly that name, as np.load allows).
//
// The zip layer is libzip (Debian's libzip-dev), never a hand-written inflater; the member's
// bytes go through the .npy parser of npy.cc (NpyBytes) with every check it makes of a file.
//
// Threat model as for .npy and safetensors: the archive may come from anyone and may have been
// written to exhaust memory, to hang us, or to make us read something other than what the
// user named. Hence:
//  - The archive is read through InputFile (a regular file only, never blocking on a FIFO),
//    via a libzip source of our own, and opened with ZIP_CHECKCONS: every member's local header
//    must agree with its central directory entry and lie before the central directory, and a
//    member name may appear once. An archive that fails is reopened without the check only to
//    say what was wrong (which name is there twice).
//  - Member names are only compared with the name the user gave, never used as paths, so a
//    name such as "../Q.npy" or "/etc/x.npy" cannot escape anywhere. Still, a NAME with '/' or
//    '\' or one that is "." or ".." is refused, and members whose names hold a separator are
//    never matched or listed: np.savez writes flat names, and the user names a member.
//  - A member name with a NUL byte (np.load cuts the name there, libzip reads the NUL as a
//    space: zip_raw_names.cc reads the raw bytes), and two members that np.load reads as one
//    array ('q' beside 'q.npy'), make the archive ambiguous: NumPy would read another member
//    than qkv. Refused, whichever array is asked for.
//  - Zip bombs: before a byte is inflated, the member's declared size must be one deflate can
//    reach from its compressed size (at most 1032 to 1) and, for a stored member, equal it.
//    The .npy parser then reads the header (at most 1 MiB) and requires the declared size to
//    equal exactly the header plus the data it describes, before the tensor is allocated; the
//    CLI checks that size against the memory budget from the header alone (inspect_tensor).
//    Reading stops at the declared size; one byte more from the stream is a refusal.
//  - The CRC-32: libzip checks it when a member is read to its end, so every read goes on to
//    the end of the stream (the probe for an extra byte) and a mismatch is refused.
//  - Encrypted members and compression methods other than stored and deflated are refused
//    before reading.
// Not caught: members whose data overlap other members' (libzip 1.7 compares each local
// header with its central entry but not the spans between them). Only the one named member is
// read, with its own size bounded as above, so an overlap cannot multiply what is inflated.
#include <zip.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/format_bytes.h"
#include "io/input_file.h"
#include "io/npy_bytes.h"
#include "io/row_spans.h"
#include "io/zip_raw_names.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {
namespace {

using io::InputFile;

// Deflate emits at most 258 bytes for a match coded in about two bits: 1032 bytes per byte of
// stream. A member that claims more than that from its compressed size is a forgery.
constexpr std::uint64_t kMaxDeflateRatio = 1032;
// The smallest deflate streams (an empty one is 2 bytes) carry their own overhead.
constexpr std::uint64_t kDeflateSlack = 1024;
// The .npy header (at most 1 MiB plus its preamble) is kept while it is read, for the parser's
// second look at bytes 8-12; the data goes straight into the tensor.
constexpr std::size_t kMaxKept = (std::size_t{1} << 20) + 16;
constexpr std::size_t kQuoteLimit = 80;

std::string str(std::uint64_t n) { return std::to_string(n); }
std::string quote(std::string_view text) { return io::quote_from_file(text, '\'', kQuoteLimit); }

// A libzip error record, finalized (its message freed) on every path out.
struct ZipError {
  zip_error_t error{};
  ZipError() { zip_error_init(&error); }
  ~ZipError() { zip_error_fini(&error); }
  ZipError(const ZipError&) = delete;
  ZipError& operator=(const ZipError&) = delete;
};

// libzip reads the archive through this: positioned reads of the InputFile. Exceptions cannot
// cross libzip's C frames, so a failed read is kept here and rethrown once libzip returns.
struct Source {
  const InputFile* file = nullptr;
  std::uint64_t position = 0;
  ZipError error;
  std::exception_ptr failure;
};

zip_int64_t source_callback(void* state, void* data, zip_uint64_t length,
                            zip_source_cmd_t command) noexcept {
  auto& source = *static_cast<Source*>(state);
  const std::uint64_t size = source.file->size();
  switch (command) {
    case ZIP_SOURCE_OPEN:
      source.position = 0;
      return 0;
    case ZIP_SOURCE_READ: {
      const std::uint64_t left = size - std::min(source.position, size);
      const std::uint64_t count = std::min<std::uint64_t>(length, left);
      try {
        if (count > 0) source.file->read_at(source.position, data, count);
      } catch (...) {
        source.failure = std::current_exception();
        zip_error_set(&source.error.error, ZIP_ER_READ, EIO);
        return -1;
      }
      source.position += count;
      return static_cast<zip_int64_t>(count);
    }
    case ZIP_SOURCE_CLOSE:
      return 0;
    case ZIP_SOURCE_STAT: {
      auto* stat = ZIP_SOURCE_GET_ARGS(zip_stat_t, data, length, &source.error.error);
      if (stat == nullptr) return -1;
      zip_stat_init(stat);
      stat->size = size;
      stat->valid |= ZIP_STAT_SIZE;
      return sizeof(zip_stat_t);
    }
    case ZIP_SOURCE_ERROR:
      return zip_error_to_data(&source.error.error, data, length);
    case ZIP_SOURCE_FREE:
      return 0;
    case ZIP_SOURCE_SEEK: {
      const zip_int64_t to =
          zip_source_seek_compute_offset(source.position, size, data, length, &source.error.error);
      if (to < 0) return -1;
      source.position = static_cast<std::uint64_t>(to);
      return 0;
    }
    case ZIP_SOURCE_TELL:
      return static_cast<zip_int64_t>(source.position);
    case ZIP_SOURCE_SUPPORTS:
      return ZIP_SOURCE_SUPPORTS_SEEKABLE;
    default:
      zip_error_set(&source.error.error, ZIP_ER_OPNOTSUPP, 0);
      return -1;
  }
}

// A failed read of the file itself is reported as InputFile words it; anything else in libzip's.
[[noreturn]] void fail_zip(const Source& source, const std::string& subject, zip_error_t* error,
                           const std::string& doing) {
  if (source.failure) std::rethrow_exception(source.failure);
  const int code = zip_error_code_zip(error);
  if (code == ZIP_ER_MEMORY) throw Error(subject, "out of memory " + doing);
  throw Error(subject, doing + ": " + zip_error_strerror(error));
}

// The array np.load calls a member: its name without a trailing .npy.
std::string array_name(const std::string& member) {
  return member.ends_with(".npy") ? member.substr(0, member.size() - 4) : member;
}

// np.load names each array by its member's name without a trailing .npy, and of two members
// with one name it reads the last. Two members giving one array name ('q' and 'q.npy', or two
// names one encoding guess makes equal) would let FILE.npz:q mean one member to qkv and another
// to NumPy: the archive is refused whichever array is asked for. (Names with a NUL byte, which
// np.load cuts there, are refused before: Archive::refuse_names_with_nul.)
void refuse_ambiguous_arrays(const std::vector<std::string>& names, const std::string& subject) {
  std::map<std::string, std::size_t> first_member;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto [it, inserted] = first_member.emplace(array_name(names[i]), i);
    if (inserted) continue;
    const std::string& other = names[it->second];
    if (other == names[i]) {
      throw Error(subject, "holds two members named " + quote(other) +
                               "; np.load would read the second as the array " + quote(it->first) +
                               ": refused as ambiguous");
    }
    throw Error(subject, "holds the members " + quote(other) + " and " + quote(names[i]) +
                             ", both the array " + quote(it->first) +
                             " to np.load (which drops .npy): refused as ambiguous");
  }
}

// An archive open for reading; closed (discarded: nothing is ever written) on every path out.
class Archive {
 public:
  Archive(const std::filesystem::path& path, const std::string& subject)
      : subject_(subject), file_(path, subject) {
    if (file_.size() == 0) throw Error(subject, "is empty (0 bytes), not an .npz archive");
    source_.file = &file_;
    zip_ = open(ZIP_RDONLY | ZIP_CHECKCONS, code_);
    if (zip_ == nullptr) explain_refusal();
    try {
      refuse_names_with_nul();
      refuse_ambiguous_arrays(names(), subject);
    } catch (...) {
      zip_discard(zip_);  // the destructor does not run for a constructor that throws
      throw;
    }
  }
  ~Archive() {
    if (zip_ != nullptr) zip_discard(zip_);
  }
  Archive(const Archive&) = delete;
  Archive& operator=(const Archive&) = delete;

  zip_t* get() const noexcept { return zip_; }
  const Source& source() const noexcept { return source_; }

  // Every member's name, in the archive's order (libzip's guess of the encoding: UTF-8, or
  // CP437 converted to UTF-8).
  std::vector<std::string> names() const { return names_of(zip_); }

 private:
  zip_t* open(int flags, int& code) {
    source_.failure = nullptr;
    ZipError error;
    zip_source_t* zip_source = zip_source_function_create(source_callback, &source_, &error.error);
    if (zip_source == nullptr) fail_zip(source_, subject_, &error.error, "cannot read it");
    zip_t* zip = zip_open_from_source(zip_source, flags, &error.error);
    if (zip == nullptr) {
      zip_source_free(zip_source);
      if (source_.failure) std::rethrow_exception(source_.failure);
      code = zip_error_code_zip(&error.error);
      if (code == ZIP_ER_MEMORY) throw Error(subject_, "out of memory reading its zip directory");
      message_ = zip_error_strerror(&error.error);
    }
    return zip;
  }

  static std::vector<std::string> names_of(zip_t* zip) {
    std::vector<std::string> names;
    const zip_int64_t count = zip_get_num_entries(zip, 0);
    for (zip_int64_t i = 0; i < count; ++i) {
      const char* name = zip_get_name(zip, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_GUESS);
      names.emplace_back(name == nullptr ? "" : name);
    }
    return names;
  }

  // libzip turns a NUL byte in a name into a space, where np.load cuts the name there: a name
  // with a space is checked against the central directory's own bytes, and one holding a NUL
  // is refused (NumPy would read it under another name than qkv).
  void refuse_names_with_nul() const {
    const zip_int64_t count = zip_get_num_entries(zip_, 0);
    bool spaced = false;
    for (zip_int64_t i = 0; i < count && !spaced; ++i) {
      const char* name = zip_get_name(zip_, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
      spaced = name != nullptr && std::strchr(name, ' ') != nullptr;
    }
    if (!spaced) return;
    const std::vector<std::string> raw =
        io::zip_raw_names(file_, static_cast<std::uint64_t>(count));
    for (zip_int64_t i = 0; i < count; ++i) {
      const char* name = zip_get_name(zip_, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
      std::string as_libzip = raw.size() == static_cast<std::size_t>(count)
                                  ? raw[static_cast<std::size_t>(i)]
                                  : std::string();
      std::replace(as_libzip.begin(), as_libzip.end(), '\0', ' ');
      if (name == nullptr || as_libzip != name) {
        throw Error(subject_,
                    "its central directory cannot be read again for the member names "
                    "(not an archive np.savez writes)");
      }
      const std::string& bytes = raw[static_cast<std::size_t>(i)];
      const std::size_t nul = bytes.find('\0');
      if (nul != std::string::npos) {
        throw Error(subject_, "the member name " + quote(bytes) +
                                  " holds a NUL byte (np.load would read it as " +
                                  quote(bytes.substr(0, nul)) + "): refused as ambiguous");
      }
    }
  }

  // The checked open failed: say why, in the words of the check that failed.
  [[noreturn]] void explain_refusal() {
    switch (code_) {
      case ZIP_ER_NOZIP:
      case ZIP_ER_INCONS:
      case ZIP_ER_EXISTS:
        break;
      case ZIP_ER_MULTIDISK:
        throw Error(subject_, "is a multi-disk zip archive, which qkv does not read");
      default:
        throw Error(subject_, "cannot be read as a zip archive: " + message_);
    }
    // Opened without the consistency check, the archive says which check failed.
    int unchecked_code = 0;
    zip_t* unchecked = open(ZIP_RDONLY, unchecked_code);
    if (unchecked == nullptr) {
      throw Error(subject_, unchecked_code == ZIP_ER_NOZIP
                                ? "is not an .npz archive: no zip central directory at its end (a "
                                  "truncated file, or not a zip file)"
                                : "is not a valid zip archive: " + message_);
    }
    std::vector<std::string> names;
    try {
      names = names_of(unchecked);
    } catch (...) {
      zip_discard(unchecked);
      throw;
    }
    zip_discard(unchecked);
    if (code_ == ZIP_ER_EXISTS) {
      std::sort(names.begin(), names.end());
      const auto twice = std::adjacent_find(names.begin(), names.end());
      if (twice != names.end()) {
        throw Error(subject_, "holds the member name " + quote(*twice) +
                                  " more than once (which one would be read?)");
      }
      throw Error(subject_, "holds a member name more than once");
    }
    throw Error(subject_, code_ == ZIP_ER_NOZIP
                              ? "is an inconsistent zip archive: a member's data runs into the "
                                "central directory (overlapping entries)"
                              : "is an inconsistent zip archive: a member's local header "
                                "disagrees with its central directory entry (overlapping or "
                                "forged entries)");
  }

  const std::string& subject_;
  InputFile file_;
  Source source_;
  zip_t* zip_ = nullptr;
  int code_ = 0;
  std::string message_;
};

// np.savez writes flat names; a user's name with a path in it names nothing here.
bool is_flat_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of("/\\") == std::string_view::npos;
}

std::string available_arrays(const std::vector<std::string>& members) {
  std::vector<std::string> arrays;
  for (const std::string& member : members) {
    if (is_flat_name(member)) arrays.push_back(array_name(member));
  }
  if (arrays.empty()) return "the archive holds no arrays qkv can name";
  std::sort(arrays.begin(), arrays.end());
  std::string text =
      "the archive holds " + str(arrays.size()) + (arrays.size() == 1 ? " array: " : " arrays: ");
  for (std::size_t i = 0; i < arrays.size() && i < 4; ++i) {
    text += (i ? ", " : "") + quote(arrays[i]);
  }
  if (arrays.size() > 4) text += ", ...";
  return text;
}

// "PATH:NAME" with control characters escaped: the subject of every error about the member.
std::string member_subject(const std::string& path, const std::string& name) {
  return path + ":" + io::printable_name(name);
}

const char* method_name(std::uint16_t method) {
  switch (method) {
    case ZIP_CM_DEFLATE64:
      return " (deflate64)";
    case ZIP_CM_BZIP2:
      return " (bzip2)";
    case ZIP_CM_LZMA:
      return " (LZMA)";
    case ZIP_CM_XZ:
      return " (xz)";
    case ZIP_CM_IMPLODE:
      return " (implode)";
    default:
      return "";
  }
}

// A member's bytes as the .npy parser reads them: inflated in order, the header kept for the
// parser's second look, the data inflated straight into the tensor; read to its end (finish),
// so that libzip checks the CRC and a stream longer than its declared size is caught.
class MemberBytes final : public io::NpyBytes {
 public:
  MemberBytes(const Archive& archive, zip_uint64_t index, std::uint64_t size, bool stored,
              const std::string& subject)
      : archive_(archive), size_(size), stored_(stored), subject_(subject) {
    file_ = zip_fopen_index(archive.get(), index, 0);
    if (file_ == nullptr) {
      fail_zip(archive.source(), subject, zip_get_error(archive.get()), "cannot read the member");
    }
  }
  ~MemberBytes() override {
    if (file_ != nullptr) zip_fclose(file_);
  }
  MemberBytes(const MemberBytes&) = delete;
  MemberBytes& operator=(const MemberBytes&) = delete;

  std::uint64_t size() const override { return size_; }

  void read_at(std::uint64_t offset, void* buffer, std::size_t count) override {
    auto* out = static_cast<char*>(buffer);
    if (offset < position_) {
      if (kept_.size() != position_) throw Error(subject_, "internal error: a read went back");
      const std::size_t again =
          static_cast<std::size_t>(std::min<std::uint64_t>(count, position_ - offset));
      std::memcpy(out, kept_.data() + offset, again);
      out += again;
      offset += again;
      count -= again;
    }
    if (count == 0) return;
    if (offset > position_) skip_to(offset);  // rows not asked for (read_tensor_rows)
    inflate(out, count);
    if (kept_.size() == position_ && position_ + count <= kMaxKept) kept_.append(out, count);
    position_ += count;
  }

  // Moves on to `offset` without keeping the bytes between: a stored member seeks there (no
  // byte of the skipped rows is read from the file), a deflated one inflates them into a
  // scratch buffer.
  void skip_to(std::uint64_t offset) {
    if (stored_ && zip_fseek(file_, static_cast<zip_int64_t>(offset), SEEK_SET) == 0) {
      position_ = offset;
      return;
    }
    if (skipped_.empty()) skipped_.resize(std::size_t{1} << 16);
    while (position_ < offset) {
      const auto count =
          static_cast<std::size_t>(std::min<std::uint64_t>(skipped_.size(), offset - position_));
      inflate(skipped_.data(), count);
      position_ += count;
    }
  }

  // After some rows: on to the declared end, then finish (a deflated member is inflated to its
  // end, so that its CRC-32 is checked; a stored one that seeked has no check to make).
  void finish_rows() {
    if (position_ < size_) skip_to(size_);
    finish();
  }

  // Reads past the declared end: nothing more may come, and libzip checks the CRC-32 there.
  void finish() {
    char extra = 0;
    const zip_int64_t got = zip_fread(file_, &extra, 1);
    if (got < 0) fail_stream();
    if (got > 0) {
      throw Error(subject_, "the member inflates to more than the " + str(size_) +
                                " bytes its zip entry declares");
    }
  }

 private:
  void inflate(char* out, std::size_t count) {
    constexpr std::size_t kChunk = std::size_t{1} << 30;
    std::uint64_t done = position_;
    while (count > 0) {
      const zip_int64_t got = zip_fread(file_, out, std::min(count, kChunk));
      if (got < 0) fail_stream();
      if (got == 0) {
        throw Error(subject_, "the member's data ends after " + str(done) +
                                  " bytes but its zip entry declares " + str(size_));
      }
      const auto n = static_cast<std::size_t>(got);
      out += n;
      count -= n;
      done += n;
    }
  }

  [[noreturn]] void fail_stream() {
    if (archive_.source().failure) std::rethrow_exception(archive_.source().failure);
    zip_error_t* error = zip_file_get_error(file_);
    switch (zip_error_code_zip(error)) {
      case ZIP_ER_CRC:
        throw Error(subject_, "the member's data fails its CRC-32 check (a damaged archive)");
      case ZIP_ER_INCONS:
        throw Error(subject_, "the member's data does not match the size its zip entry declares (" +
                                  str(size_) + " bytes)");
      case ZIP_ER_ZLIB:
      case ZIP_ER_COMPRESSED_DATA:
      case ZIP_ER_EOF:
        throw Error(subject_, std::string("the member's compressed data is invalid (") +
                                  zip_error_strerror(error) + ")");
      case ZIP_ER_MEMORY:
        throw Error(subject_, "out of memory inflating the member");
      default:
        throw Error(subject_, std::string("cannot read the member: ") + zip_error_strerror(error));
    }
  }

  const Archive& archive_;
  std::uint64_t size_;
  bool stored_;  // not compressed: seekable
  const std::string& subject_;
  zip_file_t* file_ = nullptr;
  std::uint64_t position_ = 0;  // bytes inflated so far
  std::string kept_;            // the first bytes inflated, while they are the header
  std::vector<char> skipped_;   // where skip_to inflates the bytes it does not keep (64 KiB)
};

// The member `name` names, checked before a byte of it is inflated.
struct Member {
  zip_uint64_t index = 0;
  std::uint64_t size = 0;  // declared, uncompressed
  bool stored = false;     // np.savez (not compressed), not np.savez_compressed
};

Member find_member(const Archive& archive, const std::string& archive_subject,
                   const std::string& subject, const std::string& name) {
  if (!is_flat_name(name)) {
    throw Error(subject,
                "names no member: an .npz array is named without '/' or '\\' (as "
                "np.savez names it), and members with paths are never read");
  }
  const std::vector<std::string> names = archive.names();
  // As np.load: the exact member name first, then NAME.npy.
  auto found = std::find(names.begin(), names.end(), name);
  if (found == names.end()) found = std::find(names.begin(), names.end(), name + ".npy");
  if (found == names.end()) {
    throw Error(archive_subject,
                "has no array named " + quote(name) + "; " + available_arrays(names));
  }
  Member member;
  member.index = static_cast<zip_uint64_t>(found - names.begin());
  zip_stat_t stat;
  zip_stat_init(&stat);
  if (zip_stat_index(archive.get(), member.index, 0, &stat) != 0) {
    fail_zip(archive.source(), subject, zip_get_error(archive.get()), "cannot read the member");
  }
  constexpr zip_uint64_t kNeeded =
      ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD | ZIP_STAT_ENCRYPTION_METHOD;
  if ((stat.valid & kNeeded) != kNeeded) {
    throw Error(subject, "the member's zip entry lacks its sizes or method");
  }
  if (stat.encryption_method != ZIP_EM_NONE) {
    throw Error(subject,
                "the member is encrypted; qkv reads only unencrypted members, as "
                "np.savez writes them");
  }
  if (stat.comp_method != ZIP_CM_STORE && stat.comp_method != ZIP_CM_DEFLATE) {
    throw Error(subject, "the member is compressed with zip method " + str(stat.comp_method) +
                             method_name(stat.comp_method) +
                             "; qkv reads stored (np.savez) and deflated (np.savez_compressed) "
                             "members");
  }
  member.size = stat.size;
  member.stored = stat.comp_method == ZIP_CM_STORE;
  if (stat.comp_method == ZIP_CM_STORE && stat.comp_size != stat.size) {
    throw Error(subject, "the stored member declares " + str(stat.size) + " bytes but " +
                             str(stat.comp_size) + " bytes of data");
  }
  if (stat.comp_method == ZIP_CM_DEFLATE &&
      (stat.comp_size > (UINT64_MAX - kDeflateSlack) / kMaxDeflateRatio ||
       stat.size > stat.comp_size * kMaxDeflateRatio + kDeflateSlack)) {
    throw Error(subject, "the member declares " + core::format_bytes_exact(stat.size) + " from " +
                             str(stat.comp_size) +
                             " compressed bytes, more than deflate can produce (at most 1032 "
                             "to 1): a zip bomb, refused before inflating");
  }
  return member;
}

}  // namespace

std::vector<std::string> list_npz(const std::filesystem::path& path) {
  const std::string subject = path.string();
  const Archive archive(path, subject);
  std::vector<std::string> arrays;
  for (const std::string& member : archive.names()) {
    if (is_flat_name(member)) arrays.push_back(array_name(member));
  }
  return arrays;
}

TensorInfo inspect_npz_tensor(const std::filesystem::path& path, const std::string& name) {
  const std::string archive_subject = path.string();
  const std::string subject = member_subject(archive_subject, name);
  const Archive archive(path, archive_subject);
  const Member member = find_member(archive, archive_subject, subject, name);
  MemberBytes bytes(archive, member.index, member.size, member.stored, subject);
  return io::inspect_npy_bytes(bytes, subject, io::NpyAccept::kValues);
}

Tensor read_npz_tensor(const std::filesystem::path& path, const std::string& name) {
  const std::string archive_subject = path.string();
  const std::string subject = member_subject(archive_subject, name);
  const Archive archive(path, archive_subject);
  const Member member = find_member(archive, archive_subject, subject, name);
  MemberBytes bytes(archive, member.index, member.size, member.stored, subject);
  Tensor tensor = io::read_npy_bytes(bytes, subject, io::NpyAccept::kValues);
  bytes.finish();
  return tensor;
}

Tensor read_npz_tensor_rows(const std::filesystem::path& path, const std::string& name,
                            std::span<const RowSpan> spans) {
  const std::string archive_subject = path.string();
  const std::string subject = member_subject(archive_subject, name);
  const Archive archive(path, archive_subject);
  const Member member = find_member(archive, archive_subject, subject, name);
  MemberBytes bytes(archive, member.index, member.size, member.stored, subject);
  Tensor tensor = io::read_npy_bytes_rows(bytes, subject, io::NpyAccept::kValues, spans);
  bytes.finish_rows();
  return tensor;
}

}  // namespace qkv
