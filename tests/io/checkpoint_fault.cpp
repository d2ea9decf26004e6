// checkpoint_fault — the worker of checkpoint_fault.py: one save with a fault injected at
// one file operation on one rank, and the check that follows. The driver runs it at 2 ranks
// for every operation K of a save on every rank R, with an EIO and with a crash (SIGKILL).
//
//   checkpoint_fault count  DIR             a clean save; prints "ops <rank> <count>" per rank
//   checkpoint_fault fault  DIR R K eio     the K-th file operation on rank R fails with EIO:
//                                           every rank must throw checkpoint_error or (an
//                                           ignored cleanup) succeed; then as `verify`
//   checkpoint_fault fault  DIR R K kill    rank R is killed at its K-th file operation
//   checkpoint_fault verify DIR             the folder holds the old or the new checkpoint,
//                                           bit for bit; a clean save then leaves only its
//                                           own files; prints "verified old|new"
//
// Each `fault` run first writes the old checkpoint (step 10, "which": "old") without the
// hook, then saves step 10 again ("new", other values): the same step, the case that could
// lose both. Exit code 0 when every check held; 1 with a message on stderr otherwise.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "zest/comm/checked.hpp"
#include "zest/core/error.hpp"
#include "zest/core/files.hpp"
#include "zest/core/json.hpp"
#include "zest/core/random.hpp"
#include "zest/io/checkpoint.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/tensor/tensor.hpp"

namespace {
using namespace zest;
namespace fs = std::filesystem;
using world_mesh = mesh<"dp">;

int world_rank = 0;

// One line to stderr in one write, flushed: ranks' lines never mix.
void say(const std::string& line) {
  const std::string text = detail::message("[rank ", world_rank, "] ", line, "\n");
  (void)::write(2, text.data(), text.size());
}

// -----------------------------------------------------------------------------------------
// The hook: counts this rank's file operations; at the K-th on rank R, EIO or SIGKILL.

struct fault_plan {
  int rank = -1;
  long at = 0;  // 1-based; 0: count only
  bool kill = false;
  long seen = 0;
  long hits = 0;
};
fault_plan plan;

int hook(detail::file_op op, const fs::path& path) {
  ++plan.seen;
  if (world_rank != plan.rank || plan.seen != plan.at) return 0;
  ++plan.hits;
  say(detail::message("fault at operation ", plan.seen, ": ", detail::file_op_name(op), " ",
                      path.filename().string(), plan.kill ? " (killed)" : " (EIO)"));
  if (plan.kill) ::raise(SIGKILL);
  return EIO;
}

// -----------------------------------------------------------------------------------------
// The model: three tensors, split and replicated, whose bits are a hash of (index, salt).

template <class T>
T pattern(std::uint64_t flat, std::uint32_t salt) {
  const std::uint64_t h = zest::splitmix64(flat * 1000003ULL + salt);
  if constexpr (sizeof(T) == 4) return std::bit_cast<T>(static_cast<std::uint32_t>(h));
  else return std::bit_cast<T>(h);
}

constexpr std::array<std::size_t, 2> a_ext{13, 3};
constexpr std::array<std::size_t, 2> b_ext{5, 4};
constexpr std::array<std::size_t, 1> c_ext{7};

// salt: 0 for the old checkpoint, 100 for the new one, 200 for the clean save.
std::uint32_t salt_of(std::string_view which) {
  if (which == "old") return 0;
  if (which == "new") return 100;
  if (which == "clean") return 200;
  throw std::runtime_error(
      detail::message("the manifest's metadata says \"", which, "\", neither old, new nor clean"));
}

template <class X>
void fill(X& t, std::uint32_t salt) {
  const auto& local = t.local_extents();
  const auto& offset = t.local_offsets();
  const auto& global = t.extents();
  auto data = t.local();
  for (std::size_t flat = 0; flat < data.size(); ++flat) {
    std::size_t rest = flat, g = 0, scale = 1;
    for (std::size_t k = X::rank; k-- > 0;) {
      g += (offset[k] + rest % local[k]) * scale;
      rest /= local[k];
      scale *= global[k];
    }
    data[flat] = pattern<typename X::value_type>(g, salt);
  }
}

struct model {
  tensor<float, world_mesh, "vm", layout<split<'v', "dp">>> a;
  tensor<double, world_mesh, "ab"> b;  // replicated: rank 0 alone writes it
  tensor<std::int32_t, world_mesh, "v", layout<split<'v', "dp">>> c;
  model(const world_mesh& m, std::uint32_t salt) : a(m, a_ext), b(m, b_ext), c(m, c_ext) {
    fill(a, salt + 1);
    fill(b, salt + 2);
    fill(c, salt + 3);
  }
  std::vector<io::tensor_record> records() {
    return {io::record("a", a), io::record("b", b), io::record("c", c)};
  }
};

// Loaded whole on every rank (replicated), so that every rank checks every element.
struct loaded {
  tensor<float, world_mesh, "vm"> a;
  tensor<double, world_mesh, "ab"> b;
  tensor<std::int32_t, world_mesh, "v"> c;
  explicit loaded(const world_mesh& m) : a(m, a_ext), b(m, b_ext), c(m, c_ext) {}
  std::vector<io::tensor_record> records() {
    return {io::record("a", a), io::record("b", b), io::record("c", c)};
  }
};

template <class X>
std::size_t wrong(const X& t, std::uint32_t salt) {
  std::size_t n = 0;
  const auto data = t.local();
  for (std::size_t i = 0; i < data.size(); ++i) {
    const auto want = pattern<typename X::value_type>(i, salt);
    if (std::memcmp(&data[i], &want, sizeof want) != 0) ++n;
  }
  return n;
}

io::checkpoint_info labelled(std::int64_t step, std::string_view which) {
  io::checkpoint_info info;
  info.step = step;
  info.metadata["which"] = which;
  return info;
}

[[noreturn]] void fail(const std::string& why) { throw std::logic_error(why); }

// Loads the checkpoint in dir: it must be `old` or `new` (or `clean`), bit for bit.
std::string check_loads(const fs::path& dir, const world_mesh& m) {
  loaded into(m);
  io::checkpoint_info info;
  try {
    info = io::load_checkpoint(dir, m, into.records());
  } catch (const std::exception& e) {
    fail(detail::message("no checkpoint loads (neither the old nor the new): ", e.what()));
  }
  const std::string which = info.metadata["which"].as_string();
  const std::uint32_t salt = salt_of(which);
  const std::size_t bad =
      wrong(into.a, salt + 1) + wrong(into.b, salt + 2) + wrong(into.c, salt + 3);
  if (bad != 0)
    fail(detail::message("the \"", which, "\" checkpoint loads ", bad, " wrong elements"));
  return which;
}

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// The folder's entries that its manifest does not name (" a b"; empty: none). Rank 0 looks;
// every rank fails alike (no rank left waiting in a collective).
void check_only_named(const fs::path& dir, const std::string& when) {
  MPI_Barrier(MPI_COMM_WORLD);
  int stale = 0;
  std::string extra;
  if (world_rank == 0) {
    std::set<std::string> expected{"manifest.json"};
    const json::value manifest = json::parse(read_text_file(dir / "manifest.json"));
    for (const auto& f : manifest["files"].as_array()) expected.insert(f["file"].as_string());
    for (const auto& name : listing(dir)) {
      if (!expected.contains(name)) extra += " " + name;
    }
    stale = extra.empty() ? 0 : 1;
  }
  MPI_Bcast(&stale, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (stale) fail(detail::message(when, " the folder holds files that no manifest names:", extra));
}

// The old or the new checkpoint loads; then a clean save leaves only its files.
std::string verify(const fs::path& dir, const world_mesh& m) {
  const std::string which = check_loads(dir, m);
  if (which == "clean") fail("the clean checkpoint is there before the clean save");
  {
    model clean(m, salt_of("clean"));
    io::save_checkpoint(dir, m, clean.records(), labelled(12, "clean"));
  }
  check_only_named(dir, "after a clean save");
  if (check_loads(dir, m) != "clean") fail("the clean save did not replace the checkpoint");
  return which;
}

void fresh_old_checkpoint(const fs::path& dir, const world_mesh& m) {
  if (world_rank == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  model old(m, salt_of("old"));
  io::save_checkpoint(dir, m, old.records(), labelled(10, "old"));
}

// ZEST_CHECKPOINT_FAULT_ASYNC=1: the save under test is save_checkpoint_async's, its shard
// written on a background thread, committed by wait().
void save_under_test(const fs::path& dir, const world_mesh& m,
                     std::span<const io::tensor_record> records, const io::checkpoint_info& info) {
  const char* async = std::getenv("ZEST_CHECKPOINT_FAULT_ASYNC");
  if (async != nullptr && std::string_view(async) == "1") {
    io::pending_save pending = io::save_checkpoint_async(dir, m, records, info);
    pending.wait();
  } else {
    io::save_checkpoint(dir, m, records, info);
  }
}

int run(int argc, char** argv) {
  if (argc < 3) fail("usage: checkpoint_fault count|fault|verify DIR [RANK K eio|kill]");
  const std::string mode = argv[1];
  const fs::path dir = argv[2];
  const world_mesh m(MPI_COMM_WORLD, {-1});

  if (mode == "verify") {
    const std::string which = verify(dir, m);
    if (world_rank == 0) std::printf("verified %s\n", which.c_str());
    return 0;
  }
  fresh_old_checkpoint(dir, m);
  model next(m, salt_of("new"));
  const auto records = next.records();

  if (mode == "count") {
    plan = {};
    detail::file_fault() = &hook;
    save_under_test(dir, m, records, labelled(10, "new"));
    detail::file_fault() = nullptr;
    std::array<long, 1> mine{plan.seen};
    std::vector<long> all(static_cast<std::size_t>(m.world_size()));
    MPI_Gather(mine.data(), 1, MPI_LONG, all.data(), 1, MPI_LONG, 0, MPI_COMM_WORLD);
    if (world_rank == 0)
      for (std::size_t r = 0; r < all.size(); ++r) std::printf("ops %zu %ld\n", r, all[r]);
    return 0;
  }
  if (mode != "fault" || argc != 6) fail("usage: checkpoint_fault fault DIR RANK K eio|kill");
  plan = {};
  plan.rank = std::atoi(argv[3]);
  plan.at = std::atol(argv[4]);
  plan.kill = std::string_view(argv[5]) == "kill";
  detail::file_fault() = &hook;
  int threw = 0;
  std::string what;
  try {
    save_under_test(dir, m, records, labelled(10, "new"));
  } catch (const checkpoint_error& e) {
    threw = 1;
    what = e.what();
  }
  detail::file_fault() = nullptr;
  if (plan.kill && plan.rank == world_rank && plan.hits == 0) {
    fail(detail::message("the save has ", plan.seen, " file operations on rank ", world_rank,
                         ", none at ", plan.at));
  }
  // Every rank threw, or none did (an EIO in the cleanup after the commit is ignored).
  int threw_min = 0, threw_max = 0, hits = static_cast<int>(plan.hits), hits_all = 0;
  MPI_Allreduce(&threw, &threw_min, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&threw, &threw_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&hits, &hits_all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (hits_all != 1) fail(detail::message("the fault was injected ", hits_all, " times, not once"));
  if (threw_min != threw_max) fail("some ranks threw and others did not");
  if (threw && (what.find("zest: save_checkpoint: ") == std::string::npos ||
                what.find("Input/output error") == std::string::npos)) {
    fail(detail::message("the error does not name the operation and the errno: ", what));
  }
  // A save that failed (and did not commit) leaves the folder as it found it: its own shards
  // removed, not left for a later save. (Committed but not flushed, both generations stay:
  // a crash could bring the old manifest back.)
  if (threw && !plan.kill && check_loads(dir, m) == "old")
    check_only_named(dir, "after the failed save");
  const std::string which = verify(dir, m);
  if (!threw && which != "new") fail("the save succeeded, but the old checkpoint is there");
  if (world_rank == 0) {
    std::printf("%s, verified %s%s%s\n", threw ? "threw" : "saved", which.c_str(),
                threw ? ": " : "", what.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  zest::set_checked_mode(true);
  zest::set_watchdog(std::chrono::milliseconds(20000));
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    say(detail::message("FAILED: ", e.what()));
    code = 1;
  }
  int worst = 0;
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
