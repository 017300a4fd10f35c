// MPI sessions, communicators, the error agreement, the gather of rows, the sum over ranks
// (qkv/dist.h) and the bounded wait every MPI wait of src/dist goes through (mpi_comm.h).
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dist/mpi_comm.h"
#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

bool mpi_initialised() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  return initialised != 0 && finalised == 0;
}

void require_mpi() {
  if (!mpi_initialised()) throw Error("ring", "MPI is not initialised (MPI_Init)");
}

}  // namespace

double wait_all(int count, MPI_Request* requests, MPI_Comm comm, const char* what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const double limit = wait_limit_seconds();
  for (;;) {
    int done = 0;
    MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (done != 0) return waited;
    if (waited > limit) {
      int rank = 0;
      MPI_Comm_rank(comm, &rank);
      std::fprintf(stderr,
                   "qkv: rank %d: waited more than %g s for %s (QKV_RING_TIMEOUT); aborting "
                   "every rank\n",
                   rank, limit, what);
      std::fflush(stderr);
      MPI_Abort(comm, 1);
      std::_Exit(1);  // MPI_Abort does not return; should it, the rank still ends
    }
    // Spin for the first millisecond (a message about to land), then yield, then sleep: a
    // rank that waits long leaves its core to the ranks it waits for.
    if (waited < 1e-3) continue;
    if (waited < 1e-2) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void bounded_allreduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op,
                       MPI_Comm comm, const char* what) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallreduce(send, receive, count, type, op, comm, &request);
  wait_all(1, &request, comm, what);
}

void bounded_bcast(void* data, int count, MPI_Datatype type, int root, MPI_Comm comm,
                   const char* what) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibcast(data, count, type, root, comm, &request);
  wait_all(1, &request, comm, what);
}

void bounded_allgather(const void* send, int count, MPI_Datatype type, void* receive, MPI_Comm comm,
                       const char* what) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallgather(send, count, type, receive, count, type, comm, &request);
  wait_all(1, &request, comm, what);
}

bool mpi_available() noexcept { return true; }

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (finalised != 0) throw Error("ring", "MPI was finalised in this process and cannot restart");
  if (initialised != 0) return;
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  owns_ = true;
}

MpiSession::~MpiSession() {
  if (owns_ && mpi_initialised()) MPI_Finalize();
}

Communicator Communicator::world() {
  require_mpi();
  return Communicator(static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD)));
}

Communicator Communicator::from_fortran(int handle) {
  require_mpi();
  if (MPI_Comm_f2c(static_cast<MPI_Fint>(handle)) == MPI_COMM_NULL) {
    throw Error("ring", "the communicator handle " + std::to_string(handle) + " is MPI_COMM_NULL");
  }
  return Communicator(handle);
}

int Communicator::rank() const {
  int r = 0;
  MPI_Comm_rank(mpi_comm(*this), &r);
  return r;
}

int Communicator::size() const {
  int s = 1;
  MPI_Comm_size(mpi_comm(*this), &s);
  return s;
}

// Two collectives: the lowest failing rank (MPI_Allreduce of MIN), then its problem broadcast
// from it, so that every rank throws the same error.
void agree(const Communicator& comm, const std::string& problem) {
  const MPI_Comm c = mpi_comm(comm);
  const int ranks = comm.size();
  const int mine = problem.empty() ? ranks : comm.rank();
  int first = ranks;
  bounded_allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c, "the ranks' agreement on errors");
  if (first == ranks) return;
  // One line: the problem's first line, at most 1000 bytes.
  std::string text = problem.substr(0, std::min(problem.find('\n'), std::size_t{1000}));
  int length = static_cast<int>(text.size());
  bounded_bcast(&length, 1, MPI_INT, first, c, "a failing rank's error message");
  text.resize(static_cast<std::size_t>(length));
  bounded_bcast(text.data(), length, MPI_CHAR, first, c, "a failing rank's error message");
  throw AgreedError("rank " + std::to_string(first), text);
}

namespace {

// Settings as one buffer, "name\0value\0" each, for the broadcast.
std::string serialised(const std::vector<Setting>& settings) {
  std::string text;
  for (const Setting& s : settings) {
    text += s.name;
    text += '\0';
    text += s.value;
    text += '\0';
  }
  return text;
}

std::vector<Setting> parsed(const std::string& text) {
  std::vector<Setting> settings;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t name_end = text.find('\0', at);
    const std::size_t value_end = text.find('\0', name_end + 1);
    if (name_end == std::string::npos || value_end == std::string::npos) break;
    settings.push_back({text.substr(at, name_end - at),
                        text.substr(name_end + 1, value_end - name_end - 1)});
    at = value_end + 1;
  }
  return settings;
}

// The first difference between this rank's settings and rank 0's, or "".
std::string first_difference(const std::vector<Setting>& mine, const std::vector<Setting>& root) {
  for (std::size_t i = 0; i < std::max(mine.size(), root.size()); ++i) {
    if (i >= mine.size() || i >= root.size() || mine[i].name != root[i].name) {
      return "its settings (" + std::to_string(mine.size()) + ", from another build?) differ " +
             "from rank 0's (" + std::to_string(root.size()) + ")";
    }
    if (mine[i].value != root[i].value) {
      return mine[i].name + " differs from rank 0's: " + mine[i].value + " here, " +
             root[i].value + " on rank 0";
    }
  }
  return "";
}

}  // namespace

void agree_on_settings(const Communicator& comm, const std::vector<Setting>& settings) {
  const MPI_Comm c = mpi_comm(comm);
  std::string text = serialised(settings);
  int length = mpi_count(static_cast<std::int64_t>(text.size()), "the settings");
  bounded_bcast(&length, 1, MPI_INT, 0, c, "rank 0's settings");
  std::string root(static_cast<std::size_t>(length), '\0');
  if (comm.rank() == 0) root = text;
  bounded_bcast(root.data(), length, MPI_CHAR, 0, c, "rank 0's settings");
  agree(comm, first_difference(settings, parsed(root)));
}

void barrier(const Communicator& comm) {
  const MPI_Comm c = mpi_comm(comm);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(c, &request);
  wait_all(1, &request, c, "a barrier");
}

Tensor gather_rows(const TensorView& local, int axis, std::int64_t n, RowLayout layout,
                   const Communicator& comm) {
  const MPI_Comm c = mpi_comm(comm);
  const int ranks = comm.size();
  const int me = comm.rank();
  const int r = local.rank();
  const int a = axis < 0 ? axis + r : axis;
  if (a < 0 || a >= r) throw Error(local.name, "has no row axis " + std::to_string(axis));
  const auto ua = static_cast<std::size_t>(a);
  const Tensor mine = contiguous_copy(local, local.dtype);
  std::vector<int> counts(static_cast<std::size_t>(ranks)), displs(counts.size());
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < ua; ++i) outer *= local.shape[i];
  for (std::size_t i = ua + 1; i < local.shape.size(); ++i) inner *= local.shape[i];
  const auto bytes = static_cast<std::int64_t>(dtype_size(local.dtype));
  std::int64_t total = 0;
  for (int p = 0; p < ranks; ++p) {
    const std::int64_t rows = rank_row_count(n, ranks, p, layout);
    counts[static_cast<std::size_t>(p)] = mpi_count(outer * rows * inner * bytes, "a row block");
    displs[static_cast<std::size_t>(p)] = mpi_count(total, "the gathered output");
    total += counts[static_cast<std::size_t>(p)];
  }
  std::vector<char> all(me == 0 ? static_cast<std::size_t>(total) : 0);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Igatherv(mine.data(), counts[static_cast<std::size_t>(me)], MPI_BYTE, all.data(),
               counts.data(), displs.data(), MPI_BYTE, 0, c, &request);
  wait_all(1, &request, c, "the gather of the output rows");
  if (me != 0) return Tensor();
  Shape shape = local.shape;
  shape[ua] = n;
  Tensor whole(local.dtype, shape, local.name);
  auto* to = static_cast<char*>(whole.data());
  for (int p = 0; p < ranks; ++p) {
    const char* from = all.data() + displs[static_cast<std::size_t>(p)];
    for (std::int64_t o = 0; o < outer; ++o) {
      for (const RowRange& range : rank_rows(n, ranks, p, layout)) {
        const std::int64_t run = range.size() * inner * bytes;
        std::memcpy(to + (o * n + range.first) * inner * bytes, from,
                    static_cast<std::size_t>(run));
        from += run;
      }
    }
  }
  return whole;
}

namespace {

template <class T>
void add_parts(const std::vector<char>& parts, std::int64_t count, int ranks, Tensor& sum) {
  T* out = sum.data_as<T>();
  const auto* part = reinterpret_cast<const T*>(parts.data());
  std::copy(part, part + count, out);
  for (int r = 1; r < ranks; ++r) {
    part += count;
    for (std::int64_t e = 0; e < count; ++e) out[e] += part[e];
  }
}

}  // namespace

Tensor sum_over_ranks(const TensorView& local, const Communicator& comm) {
  const MPI_Comm c = mpi_comm(comm);
  const int ranks = comm.size();
  const int me = comm.rank();
  // Every rank's element count and dtype first: a rank whose part differs is then the same
  // error on every rank, not a gather whose sizes never match.
  const std::array<std::int64_t, 2> mine = {local.numel(), static_cast<std::int64_t>(local.dtype)};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(ranks));
  bounded_allgather(mine.data(), 2, MPI_INT64_T, all.data(), c, "every rank's part of a sum");
  for (int r = 0; r < ranks; ++r) {
    const std::size_t i = 2 * static_cast<std::size_t>(r);
    if (all[i] != all[0] || all[i + 1] != all[1]) {
      throw AgreedError("rank " + std::to_string(r),
                        local.name + ": its part of the sum over ranks has " +
                            std::to_string(all[i]) + " elements of another shape or dtype than " +
                            "rank 0's " + std::to_string(all[0]));
    }
  }
  if (local.dtype != DType::kF32 && local.dtype != DType::kF64) {
    throw AgreedError(local.name, std::string("the sum over ranks adds float32 or float64, got ") +
                                      dtype_name(local.dtype));
  }
  const Tensor part = contiguous_copy(local, local.dtype);
  const std::int64_t count = local.numel();
  const int bytes =
      mpi_count(count * static_cast<std::int64_t>(dtype_size(local.dtype)), "a rank's part");
  std::vector<char> parts(
      me == 0 ? static_cast<std::size_t>(bytes) * static_cast<std::size_t>(ranks) : 0);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Igather(part.data(), bytes, MPI_BYTE, parts.data(), bytes, MPI_BYTE, 0, c, &request);
  wait_all(1, &request, c, "the gather of every rank's part of a sum");
  if (me != 0) return Tensor();
  Tensor sum(local.dtype, local.shape, local.name);
  if (local.dtype == DType::kF64) {
    add_parts<double>(parts, count, ranks, sum);
  } else {
    add_parts<float>(parts, count, ranks, sum);
  }
  return sum;
}

}  // namespace qkv::dist
