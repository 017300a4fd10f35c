// Output files that appear whole or not at all.
//
// Each output is written to a temporary file in its destination's directory (the same file
// system, so rename(2) can move it into place atomically), flushed to disk, and renamed over
// the destination only when every output of the command has been written. Until then the
// destination keeps whatever it held; a reader never sees a partial file.
//
// Committing several files is a sequence of renames, not one atomic step. Everything that can
// be known to make a rename fail is checked when staging (output_paths.cc: name and path
// length, the folder, non-regular and dangling destinations), so a rename that fails at commit
// means the file system changed under us. Even then the set stays all or nothing: before the
// first rename, each destination that exists gets a hard link (a backup under a temporary
// name); if a later rename fails, the outputs already renamed are put back (the backup renamed
// over it, or the new file unlinked where there was none) before the error is reported, and the
// backups are removed once every rename succeeded. What remains is a power cut or SIGKILL
// between two renames (docs/hardening.md).
//
// Concurrent runs. A commit holds an exclusive flock(2) on each destination folder, taken in
// (device, inode) order so that two runs cannot deadlock, from before its first rename until
// after its last (and its rollback): two runs writing the same outputs commit one after the
// other, never interleaved. The lock is on the folder itself, so no lock file is created or
// left behind; where flock is not available (some network file systems) the commit goes ahead
// unlocked.
//
// Interruption. A run stopped by a signal in kCleanupSignals must not leave its temporary files
// behind. Every temporary path is entered in a fixed table before the file is created and
// leaves it once renamed or removed. The first entry installs a handler for those signals
// (only where the signal still has its default action: an application's own handler, or an
// inherited "ignore", is left alone) that unlinks every path in the table, then lets the
// signal take its default action, so the process still dies of it (exit status 128 + signal in
// a shell). SIGPIPE and SIGXFSZ keep their meaning: the process still dies of them as before
// (where they are ignored, a write fails with EPIPE or EFBIG and is reported in one line). The
// handler uses only async-signal-safe calls: atomic loads, unlink, raise. The table is static
// storage (no allocation, no lock), so a signal on any thread at any moment finds it
// consistent: a slot is published with a release store after its path is written. Temporary
// names carry the process id and a random suffix and are created with O_EXCL, so a path entered
// just before its file is created can name nothing but ours, and a leftover of a killed run
// (SIGKILL cannot be handled) is never reused. Commits run with those signals blocked, so a
// signal arriving during a commit takes effect after every output is in place (or rolled back);
// qkv's own worker threads block them for good (core/termination_signals.h), and a handler that
// runs on any other thread waits for a commit's renames to finish before it cleans up (the
// handshake below), so a set of outputs is all old or all new whichever thread takes the signal.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <utility>

#include "core/termination_signals.h"
#include "io/input_file.h"
#include "io/output_paths.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {

using io::errno_message;

// One staged output. `temp` is empty once it has been renamed into place (or removed).
struct OutputFiles::Staged {
  std::filesystem::path destination;  // as given, for messages
  io::OutputTarget target;            // the file to replace, resolved
  std::filesystem::path temp;
  int slot = -1;  // its entry in the table of temporary files, or -1
};

namespace {

// ---- The table of temporary files that a signal handler removes. ----

constexpr std::size_t kTempSlots = 64;
constexpr std::size_t kTempPathBytes = 4096;
// The signals handled (core/termination_signals.h).
constexpr const auto& kCleanupSignals = core::kTerminationSignals;

enum SlotState : int { kSlotFree = 0, kSlotWriting = 1, kSlotReady = 2 };

struct TempSlot {
  std::atomic<int> state{kSlotFree};
  char path[kTempPathBytes];
};

static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

TempSlot g_temp_slots[kTempSlots];

// A commit's renames and a handler's cleanup exclude each other, whichever threads run them.
// The committing thread blocks the signals, but another thread may take one (a thread of the
// application's, or a BLAS library's, that does not block them): its handler must then neither
// unlink the temporary files the commit is about to rename nor end the process between two
// renames. The handshake (sequentially consistent, so that one side always sees the other):
// the handler raises g_process_ending and then waits while g_commits_renaming is not zero; a
// commit counts itself in g_commits_renaming and then, seeing g_process_ending, backs out before
// its first rename. So a signal ends the process with each set of outputs all old (temporary
// files removed by the handler) or all new (renamed, backups removed by the commit).
std::atomic<bool> g_process_ending{false};
std::atomic<int> g_commits_renaming{0};

static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs lock-free atomics");

extern "C" void remove_temp_files_and_reraise(int signal_number) {
  const int saved_errno = errno;
  g_process_ending.store(true);
  // A commit is a few renames: milliseconds at most. poll() is async-signal-safe, and this
  // thread is never the committing one (the commit blocks these signals).
  while (g_commits_renaming.load() != 0) ::poll(nullptr, 0, 1);
  for (TempSlot& slot : g_temp_slots) {
    if (slot.state.load(std::memory_order_acquire) == kSlotReady) ::unlink(slot.path);
  }
  // SA_RESETHAND has restored the default action; the signal is blocked until we return, then
  // delivered again and ends the process as it would have without us.
  ::raise(signal_number);
  errno = saved_errno;
}

// A forked child starts with none of its parent's temporary files and no commit: its handler
// must not unlink the files its parent is still writing and renaming (before, a child that
// died of a signal made its parent's commit fail with ENOENT), nor wait for a commit that was
// renaming on another thread of the parent (it would wait for ever).
void forget_parent_outputs_in_child() {
  for (TempSlot& slot : g_temp_slots) slot.state.store(kSlotFree);
  g_commits_renaming.store(0);
  g_process_ending.store(false);
}

void install_cleanup_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::pthread_atfork(nullptr, nullptr, forget_parent_outputs_in_child);
    for (const int signal_number : kCleanupSignals) {
      struct sigaction current {};
      if (::sigaction(signal_number, nullptr, &current) != 0) continue;
      if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) continue;
      struct sigaction action {};
      action.sa_handler = remove_temp_files_and_reraise;
      sigemptyset(&action.sa_mask);
      for (const int other : kCleanupSignals) sigaddset(&action.sa_mask, other);
      action.sa_flags = static_cast<int>(SA_RESETHAND);
      ::sigaction(signal_number, &action, nullptr);
    }
  });
}

// Enters `path` in the table; returns its slot, or -1 if the table is full or the path too long
// (the file is then not removed on a signal, which is all that is lost).
int register_temp(const std::filesystem::path& path) {
  const std::string& text = path.native();
  if (text.size() >= kTempPathBytes) return -1;
  for (std::size_t i = 0; i < kTempSlots; ++i) {
    int expected = kSlotFree;
    if (!g_temp_slots[i].state.compare_exchange_strong(expected, kSlotWriting)) continue;
    std::memcpy(g_temp_slots[i].path, text.c_str(), text.size() + 1);
    g_temp_slots[i].state.store(kSlotReady, std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

void unregister_temp(int slot) {
  if (slot >= 0) g_temp_slots[static_cast<std::size_t>(slot)].state.store(kSlotFree);
}

// The commit's side of the handshake above: counted among the commits renaming for its
// lifetime, or, when a handler has begun ending the process, an Error before any rename (the
// process dies of the signal as soon as the handler re-raises it). Only on a thread that blocks
// the cleanup signals, so that the handler never waits for the thread it runs on.
class RenamesInProgress {
 public:
  explicit RenamesInProgress(const std::string& subject) {
    g_commits_renaming.fetch_add(1);
    if (g_process_ending.load()) {
      g_commits_renaming.fetch_sub(1);
      throw Error(subject, "not moved into place: the process is ending on a signal");
    }
  }
  ~RenamesInProgress() { g_commits_renaming.fetch_sub(1); }
  RenamesInProgress(const RenamesInProgress&) = delete;
  RenamesInProgress& operator=(const RenamesInProgress&) = delete;
};

}  // namespace

// Only on request (io.h): a library leaves the process's signal dispositions as it found them.
void install_output_cleanup_on_signals() { install_cleanup_handlers(); }

namespace {

// ---- Creating, writing and syncing the temporary files. ----

// Long destination names are shortened in the temporary name so that it stays within
// NAME_MAX (255 bytes on common file systems) after the prefix and suffix are added.
constexpr std::size_t kMaxNameInTemp = 128;
constexpr int kTempAttempts = 100;

std::string random_suffix() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<std::size_t> pick(0, sizeof kChars - 2);
  std::string suffix(6, ' ');
  for (char& c : suffix) c = kChars[pick(rng)];
  return suffix;
}

std::string temp_name(const std::filesystem::path& destination) {
  std::string name = destination.filename().string();
  if (name.size() > kMaxNameInTemp) name.resize(kMaxNameInTemp);
  return "." + name + ".qkv-tmp-" + std::to_string(::getpid()) + "-" + random_suffix();
}

// Creates ".<name>.qkv-tmp-<pid>-XXXXXX" beside `destination`, entered in the table of
// temporary files, and returns its descriptor, path and slot. Unlike mkstemp, which makes the
// file 0600, this creates it 0666 less the umask, so that the renamed output has the
// permissions a plain write would have given it.
struct Temp {
  int fd = -1;
  std::filesystem::path path;
  int slot = -1;
};

Temp create_temp(const std::filesystem::path& destination, const std::string& subject) {
  const std::filesystem::path directory = destination.parent_path();
  for (int attempt = 0; attempt < kTempAttempts; ++attempt) {
    std::filesystem::path temp = directory / temp_name(destination);
    // Entered before the file exists, so that no moment has it on disk and off the table.
    const int slot = register_temp(temp);
    int fd;
    do {
      fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) return {fd, std::move(temp), slot};
    const int err = errno;
    unregister_temp(slot);
    if (err != EEXIST) {
      throw Error(subject,
                  "cannot create a temporary file in its directory: " + errno_message(err));
    }
  }
  throw Error(subject, "cannot create a temporary file in its directory: every name tried exists");
}

// Writes all of `bytes`, flushes them to disk and closes `fd`; returns 0 or the errno of the
// first failure. The descriptor is closed on every path.
int write_sync_close(int fd, const std::vector<char>& bytes) {
  int err = 0;
  const char* data = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0 && err == 0) {
    const ssize_t wrote = ::write(fd, data, left);
    if (wrote < 0) {
      if (errno != EINTR) err = errno;
      continue;
    }
    data += wrote;
    left -= static_cast<std::size_t>(wrote);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  // Some file systems (NFS) report a failed write only at close.
  if (::close(fd) != 0 && err == 0 && errno != EINTR) err = errno;
  return err;
}

// Makes the renames themselves durable. Best effort: the data is already safe, and a failure
// here cannot be undone or usefully reported.
void sync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// A hard link to `file` under a temporary name beside it, so that the file can be put back if
// the commit fails after replacing it; empty if none could be made (EPERM or ENOTSUP: a file
// system without hard links; ENOENT: the file went away since staging).
std::filesystem::path keep_backup(const std::filesystem::path& file) {
  for (int attempt = 0; attempt < kTempAttempts; ++attempt) {
    std::filesystem::path backup = file.parent_path() / temp_name(file);
    if (::link(file.c_str(), backup.c_str()) == 0) return backup;
    if (errno != EEXIST) break;
  }
  return {};
}

// Exclusive flock(2)s on every destination folder of a commit, released on every path out.
class FolderLocks {
 public:
  explicit FolderLocks(const std::vector<io::OutputTarget*>& targets) {
    // In (device, inode) order, one per folder however spelled, so that two commits over
    // overlapping folders take them in the same order and cannot deadlock.
    std::vector<const io::OutputTarget*> folders(targets.begin(), targets.end());
    const auto key = [](const io::OutputTarget* t) {
      return std::pair(t->directory_device, t->directory_inode);
    };
    std::sort(folders.begin(), folders.end(), [&](auto* a, auto* b) { return key(a) < key(b); });
    folders.erase(std::unique(folders.begin(), folders.end(),
                              [&](auto* a, auto* b) { return key(a) == key(b); }),
                  folders.end());
    fds_.reserve(folders.size());
    for (const io::OutputTarget* folder : folders) {
      const int fd = ::open(folder->directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      // A folder that cannot be opened now makes its rename fail, which the commit handles.
      if (fd < 0) continue;
      fds_.push_back(fd);
      // Waits for another run's commit. Signals are not blocked yet, so an interrupted wait
      // ends the run cleanly. Other errors (ENOLCK on some network file systems): unlocked.
      while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  ~FolderLocks() {
    for (const int fd : fds_) ::close(fd);  // closing the descriptor releases its lock
  }
  FolderLocks(const FolderLocks&) = delete;
  FolderLocks& operator=(const FolderLocks&) = delete;

 private:
  std::vector<int> fds_;
};

}  // namespace

OutputFiles::OutputFiles() = default;

OutputFiles::~OutputFiles() {
  for (const Staged& staged : staged_) {
    if (!staged.temp.empty()) ::unlink(staged.temp.c_str());
    unregister_temp(staged.slot);
  }
}

void OutputFiles::stage(const std::filesystem::path& path, const std::vector<char>& bytes) {
  const std::string subject = path.string();
  if (!path.has_filename()) throw Error(subject, "is not a file name");
  // Caught now rather than at commit, when other outputs may already have been renamed.
  io::OutputTarget target = io::resolve_output(path, subject);
  for (const Staged& staged : staged_) {
    if (!staged.temp.empty() && io::same_output(staged.target, target)) {
      throw Error(subject, "is given as more than one output");
    }
  }

  // Reserved first: once the temporary file exists, recording it must not fail.
  staged_.reserve(staged_.size() + 1);
  Temp temp = create_temp(target.path, subject);
  // Recorded before writing, so the temporary file is on the one list from its creation.
  staged_.push_back(Staged{path, std::move(target), temp.path, temp.slot});
  const int err = write_sync_close(temp.fd, bytes);
  if (err != 0) {
    ::unlink(temp.path.c_str());
    unregister_temp(temp.slot);
    staged_.pop_back();
    throw Error(subject, "cannot write: " + errno_message(err));
  }
}

void OutputFiles::stage_npy(const std::filesystem::path& path, const TensorView& view,
                            DType dtype) {
  stage(path, encode_npy(view, dtype));
}

void OutputFiles::commit() {
  std::vector<Staged*> pending;
  std::vector<io::OutputTarget*> targets;
  for (Staged& staged : staged_) {
    if (staged.temp.empty()) continue;
    pending.push_back(&staged);
    targets.push_back(&staged.target);
  }
  {
    const FolderLocks locks(targets);
    const core::TerminationSignalsBlocked blocked;
    // Where the mask could not be set (it always can), the handler might run on this very
    // thread: then no handshake, which would wait for itself.
    std::optional<RenamesInProgress> renaming;
    if (blocked.blocked() && !pending.empty()) {
      renaming.emplace(pending.front()->destination.string());
    }
    // With one output there is nothing to roll back: a failed rename leaves it as it was.
    std::vector<std::filesystem::path> backups(pending.size());
    if (pending.size() > 1) {
      for (std::size_t i = 0; i < pending.size(); ++i) {
        if (pending[i]->target.exists) backups[i] = keep_backup(pending[i]->target.path);
      }
    }
    // Undoes the renames of pending[0, failed): each replaced file comes back from its backup,
    // and one that did not exist before is removed; removes every backup. Returns the outputs
    // that could not be restored (no backup: a file system without hard links).
    const auto roll_back = [&](std::size_t failed) {
      std::string not_restored;
      for (std::size_t i = failed; i-- > 0;) {
        const io::OutputTarget& target = pending[i]->target;
        bool restored = false;
        if (!backups[i].empty()) {
          restored = ::rename(backups[i].c_str(), target.path.c_str()) == 0;
        } else if (!target.exists) {
          restored = ::unlink(target.path.c_str()) == 0;
        }
        if (!restored) {
          not_restored += (not_restored.empty() ? "" : ", ") + pending[i]->destination.string();
        }
      }
      for (std::size_t i = failed; i < backups.size(); ++i) {
        if (!backups[i].empty()) ::unlink(backups[i].c_str());
      }
      return not_restored;
    };
    for (std::size_t i = 0; i < pending.size(); ++i) {
      Staged& staged = *pending[i];
      if (::rename(staged.temp.c_str(), staged.target.path.c_str()) != 0) {
        const int err = errno;
        const std::string not_restored = roll_back(i);
        throw Error(
            staged.destination.string(),
            "cannot move the finished file into place: " + errno_message(err) +
                (not_restored.empty() ? "; the other outputs were left as they were"
                                      : "; already replaced and not restorable: " + not_restored));
      }
      staged.temp.clear();
      unregister_temp(staged.slot);
      staged.slot = -1;
    }
    for (const auto& backup : backups) {
      if (!backup.empty()) ::unlink(backup.c_str());
    }
  }
  std::vector<const io::OutputTarget*> synced;
  for (const io::OutputTarget* target : targets) {
    const bool seen = std::any_of(synced.begin(), synced.end(), [&](const io::OutputTarget* t) {
      return t->directory_device == target->directory_device &&
             t->directory_inode == target->directory_inode;
    });
    if (!seen) {
      sync_directory(target->directory);
      synced.push_back(target);
    }
  }
  staged_.clear();
}

void write_npy(const std::filesystem::path& path, const TensorView& view, DType dtype) {
  OutputFiles files;
  files.stage_npy(path, view, dtype);
  files.commit();
}

}  // namespace qkv
