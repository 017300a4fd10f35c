// Resolving and checking an output's destination before anything is written (see the header).
//
// OutputFiles renames several temporary files into place at commit. Whatever can be known to
// make one of those renames fail is checked here, at staging, so that a failure at commit means
// the file system changed in between (and is rolled back there): the checks below are what
// rename(2) and open(2) would say, asked before any output is replaced.
#include "io/output_paths.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "io/input_file.h"
#include "qkv/error.h"

namespace qkv::io {
namespace {

[[noreturn]] void fail_write(const std::string& subject, int err, const std::string& detail = "") {
  throw Error(subject, "cannot write: " + errno_message(err) + detail);
}

[[noreturn]] void refuse_kind(const std::string& subject, mode_t mode) {
  throw Error(subject, "is not a regular file (" + file_kind(mode) + "); refusing to replace it");
}

}  // namespace

OutputTarget resolve_output(const std::filesystem::path& destination, const std::string& subject) {
  OutputTarget target;
  target.path = destination;
  struct stat info {};
  if (::lstat(destination.c_str(), &info) == 0) {
    if (S_ISLNK(info.st_mode)) {
      // Written through to its target, as `>` would, so that the link stays a link.
      if (::stat(destination.c_str(), &info) != 0) {
        if (errno != ENOENT) fail_write(subject, errno);
        // A dangling link would make us create a file wherever it points: a classic way to
        // have a program write where its user did not mean it to.
        throw Error(subject,
                    "is a symbolic link to a missing file; refusing to create a file through it");
      }
      if (S_ISREG(info.st_mode)) {
        std::error_code error;
        target.path = std::filesystem::canonical(destination, error);
        if (error) fail_write(subject, error.value());
      }
    }
    if (S_ISDIR(info.st_mode)) fail_write(subject, EISDIR);
    if (!S_ISREG(info.st_mode)) refuse_kind(subject, info.st_mode);
    target.exists = true;
  } else if (errno != ENOENT) {
    // ENAMETOOLONG, ENOTDIR, EACCES, ELOOP: the rename would fail the same way.
    fail_write(subject, errno);
  }

  target.directory = target.path.parent_path();
  if (target.directory.empty()) target.directory = ".";
  struct stat folder {};
  if (::stat(target.directory.c_str(), &folder) != 0) fail_write(subject, errno);
  if (!S_ISDIR(folder.st_mode)) fail_write(subject, ENOTDIR);
  target.directory_device = folder.st_dev;
  target.directory_inode = folder.st_ino;

  // The temporary name is shortened to fit; the final name must fit as it is.
  const std::size_t name_bytes = target.path.filename().native().size();
  const long name_max = ::pathconf(target.directory.c_str(), _PC_NAME_MAX);
  if (name_max > 0 && name_bytes > static_cast<std::size_t>(name_max)) {
    fail_write(subject, ENAMETOOLONG,
               " (" + std::to_string(name_bytes) + " bytes; its folder allows " +
                   std::to_string(name_max) + ")");
  }
  if (target.path.native().size() >= PATH_MAX) {
    fail_write(subject, ENAMETOOLONG,
               " (the path is " + std::to_string(target.path.native().size()) + " bytes)");
  }
  if (::faccessat(AT_FDCWD, target.directory.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    fail_write(subject, errno);
  }
  // In a sticky folder (/tmp), only a file's owner, the folder's owner or root may replace it.
  const uid_t user = ::geteuid();
  if (target.exists && (folder.st_mode & S_ISVTX) != 0 && user != 0 && folder.st_uid != user &&
      info.st_uid != user) {
    fail_write(subject, EPERM, " (its folder is sticky and the file belongs to another user)");
  }
  return target;
}

bool same_output(const OutputTarget& a, const OutputTarget& b) {
  return a.directory_device == b.directory_device && a.directory_inode == b.directory_inode &&
         a.path.filename() == b.path.filename();
}

}  // namespace qkv::io
