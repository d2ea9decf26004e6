// checkpoints: save on one mesh and layout, load on another (other layouts, other rank
// counts, 1-D and 2-D meshes), bit-exact; corrupt, truncated and mismatching checkpoints
// refused on every rank with nothing loaded (the manifest's own checksum included); atomic
// replacement of an older checkpoint and of the same step; an EIO on one rank thrown on
// every rank, leaving the old or the new checkpoint; load_checkpoint's accept.
// Every element's bits are a hash of its global index, so NaN payloads, infinities and
// subnormals all go through, and a misplaced block shows.
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "support/fixtures.hpp"
#include "support/mpi_test.hpp"
#include "zest/core/json.hpp"
#include "zest/core/random.hpp"
#include "zest/io/checkpoint.hpp"
#include "zest/io/checksum.hpp"

namespace {
using namespace zest;
namespace fs = std::filesystem;
using zest::testing::world;

using world_mesh = mesh<"dp">;
using one_mesh = local_mesh<"dp">;
using grid_mesh = mesh<"dp", "tp">;

// ---------------------------------------------------------------------------------------
// Data: the bits of element i of tensor `salt` are a hash of (i, salt).

template <class T>
T pattern(std::uint64_t flat, std::uint32_t salt) {
  const std::uint64_t h = zest::splitmix64(flat * 1000003ULL + salt);
  if constexpr (std::is_same_v<T, float>)
    return std::bit_cast<float>(static_cast<std::uint32_t>(h));
  else if constexpr (std::is_same_v<T, double>) return std::bit_cast<double>(h);
  else if constexpr (std::is_same_v<T, bfloat16>)
    return bfloat16::from_bits(static_cast<std::uint16_t>(h));
  else return static_cast<T>(h);
}

// Calls f(local flat index, global flat index) for each element of t's block.
template <class X, class F>
void for_each_element(const X& t, F&& f) {
  const auto& local = t.local_extents();
  const auto& offset = t.local_offsets();
  const auto& global = t.extents();
  const std::size_t count = t.local_count();
  for (std::size_t flat = 0; flat < count; ++flat) {
    std::size_t rest = flat, g = 0, scale = 1;
    for (std::size_t k = X::rank; k-- > 0;) {
      g += (offset[k] + rest % local[k]) * scale;
      rest /= local[k];
      scale *= global[k];
    }
    f(flat, g);
  }
}

template <class X>
X make(const typename X::mesh_type& m, const typename X::extents_type& extents,
       std::uint32_t salt) {
  X t(m, extents);
  auto data = t.local();
  for_each_element(
      t, [&](std::size_t i, std::size_t g) { data[i] = pattern<typename X::value_type>(g, salt); });
  return t;
}

// Elements whose bits differ from the pattern.
template <class X>
std::size_t wrong_bits(const X& t, std::uint32_t salt) {
  using T = typename X::value_type;
  std::size_t wrong = 0;
  const auto data = t.local();
  for_each_element(t, [&](std::size_t i, std::size_t g) {
    const T want = pattern<T>(g, salt);
    if (std::memcmp(&data[i], &want, sizeof(T)) != 0) ++wrong;
  });
  return wrong;
}

// A tensor of the given type whose every byte is 0xA5: "not loaded".
template <class X>
X sentinel(const typename X::mesh_type& m, const typename X::extents_type& extents) {
  X t(m, extents);
  const auto bytes = std::as_writable_bytes(t.local());
  std::memset(bytes.data(), 0xA5, bytes.size());
  return t;
}
template <class X>
bool untouched(const X& t) {
  const auto bytes = std::as_bytes(t.local());
  for (const std::byte b : bytes)
    if (b != std::byte{0xA5}) return false;
  return true;
}

// ---------------------------------------------------------------------------------------
// A folder every rank sees, removed at the end.

class shared_dir {
 public:
  explicit shared_dir(std::string_view tag) {
    std::array<char, 1024> name{};
    if (world().rank == 0) {
      static int counter = 0;
      const fs::path p =
          fs::temp_directory_path() / ("zest-ckpt-" + std::to_string(::getpid()) + "-" +
                                       std::to_string(counter++) + "-" + std::string(tag));
      fs::remove_all(p);
      fs::create_directories(p);
      const std::string s = p.string();
      std::memcpy(name.data(), s.data(), std::min(s.size(), name.size() - 1));
    }
    MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name.data();
  }
  shared_dir(const shared_dir&) = delete;
  shared_dir& operator=(const shared_dir&) = delete;
  ~shared_dir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world().rank == 0) {
      std::error_code ignored;
      fs::remove_all(path_, ignored);
    }
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

std::vector<std::string> file_names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

// The message an expression throws as E, or "" (and a failed check) when it does not.
template <class E, class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("threw another exception: " << e.what());
    return "";
  }
  FAIL("did not throw");
  return "";
}

bool has(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// ---------------------------------------------------------------------------------------
// The model of most tests: five tensors of four dtypes, uneven extents.

constexpr std::array<std::size_t, 2> wte_ext{103, 6};
constexpr std::array<std::size_t, 2> ln_ext{7, 5};
constexpr std::array<std::size_t, 2> w_ext{6, 7};
constexpr std::array<std::size_t, 1> e_ext{7};
constexpr std::array<std::size_t, 3> idx_ext{5, 3, 2};

// The saved layouts.
template <class Mesh>
struct saved_model {
  using wte_t = tensor<float, Mesh, "vm", layout<split<'v', "dp">>>;
  using ln_t = tensor<float, Mesh, "vm">;
  using w_t = tensor<double, Mesh, "ab", layout<split<'b', "dp">>>;
  using e_t = tensor<bfloat16, Mesh, "v", layout<split<'v', "dp">>>;
  using idx_t = tensor<std::int32_t, Mesh, "abc", layout<split<'c', "dp">>>;
  wte_t wte;
  ln_t ln;
  w_t w;
  e_t e;
  idx_t idx;
  explicit saved_model(const Mesh& m)
      : wte(make<wte_t>(m, wte_ext, 1)),
        ln(make<ln_t>(m, ln_ext, 2)),
        w(make<w_t>(m, w_ext, 3)),
        e(make<e_t>(m, e_ext, 4)),
        idx(make<idx_t>(m, idx_ext, 5)) {}
  std::vector<io::tensor_record> records() {
    return {io::record("wte", wte), io::record("ln", ln), io::record("w", w), io::record("e", e),
            io::record("idx", idx)};
  }
};

// The same tensors in other layouts (template parameters pick them), all "not loaded".
template <class Wte, class Ln, class W, class E, class Idx>
struct loaded_model {
  Wte wte;
  Ln ln;
  W w;
  E e;
  Idx idx;
  explicit loaded_model(const typename Wte::mesh_type& m)
      : wte(sentinel<Wte>(m, wte_ext)),
        ln(sentinel<Ln>(m, ln_ext)),
        w(sentinel<W>(m, w_ext)),
        e(sentinel<E>(m, e_ext)),
        idx(sentinel<Idx>(m, idx_ext)) {}
  std::vector<io::tensor_record> records() {
    return {io::record("wte", wte), io::record("ln", ln), io::record("w", w), io::record("e", e),
            io::record("idx", idx)};
  }
  std::size_t wrong() const {
    return wrong_bits(wte, 1) + wrong_bits(ln, 2) + wrong_bits(w, 3) + wrong_bits(e, 4) +
           wrong_bits(idx, 5);
  }
  bool untouched_all() const {
    return untouched(wte) && untouched(ln) && untouched(w) && untouched(e) && untouched(idx);
  }
};

template <class Mesh>
using other_layouts =
    loaded_model<tensor<float, Mesh, "vm", layout<split<'m', "dp">>>,
                 tensor<float, Mesh, "vm", layout<split<'v', "dp">>>,
                 tensor<double, Mesh, "ab", layout<split<'a', "dp">>>, tensor<bfloat16, Mesh, "v">,
                 tensor<std::int32_t, Mesh, "abc", layout<split<'a', "dp">>>>;
template <class Mesh>
using replicated_layouts =
    loaded_model<tensor<float, Mesh, "vm">, tensor<float, Mesh, "vm">, tensor<double, Mesh, "ab">,
                 tensor<bfloat16, Mesh, "v">, tensor<std::int32_t, Mesh, "abc">>;
template <class Mesh>
using same_layouts =
    loaded_model<typename saved_model<Mesh>::wte_t, typename saved_model<Mesh>::ln_t,
                 typename saved_model<Mesh>::w_t, typename saved_model<Mesh>::e_t,
                 typename saved_model<Mesh>::idx_t>;

// (g++ 12 warns about designated initializers that leave members to their defaults.)
io::checkpoint_info at_step(std::int64_t step) {
  io::checkpoint_info info;
  info.step = step;
  return info;
}

// A changed manifest with its own checksum made again: as if save_checkpoint had written it.
std::string sealed(json::value manifest) {
  manifest["manifest_checksum"] = io::format_checksum(io::detail::manifest_checksum(manifest));
  return json::dump(manifest, 1);
}

// Restores read_chunk_bytes on scope exit.
struct chunk_bytes {
  std::size_t saved = io::detail::read_chunk_bytes();
  explicit chunk_bytes(std::size_t n) { io::detail::read_chunk_bytes() = n; }
  chunk_bytes(const chunk_bytes&) = delete;
  chunk_bytes& operator=(const chunk_bytes&) = delete;
  ~chunk_bytes() { io::detail::read_chunk_bytes() = saved; }
};

// ---------------------------------------------------------------------------------------

TEST_CASE("xxh64 matches the reference implementation, in one piece or many") {
  // The published value for empty input, and values from the reference implementation for
  // bytes (31 i + 7) mod 256 of each length, seeds 0 and 12345.
  struct vector_case {
    std::size_t length;
    std::uint64_t seed0, seed12345;
  };
  const vector_case cases[] = {
      {0, 0xef46db3751d8e999ULL, 0x95584af7701f808dULL},
      {1, 0xa96c7f0ce858bbb7ULL, 0x496fc29a1e753bd7ULL},
      {3, 0x56e6957632a487f9ULL, 0x94ff877cd86385beULL},
      {4, 0xc60d15b1e3ff8f04ULL, 0x1034b01f61e3b2e6ULL},
      {7, 0xafbefc3d6c6f9a8eULL, 0xd06aa9dbe7add6d1ULL},
      {8, 0x3da5c7aa269683e0ULL, 0x23befc2f0d90da1aULL},
      {9, 0x4b17a9ba9e215c09ULL, 0x9117b0959c2277a2ULL},
      {31, 0x4a74f3a1a39ad4a1ULL, 0xbff21e6871cdf167ULL},
      {32, 0x8d57d6a4671cc43dULL, 0x7bdfe9fbcc771266ULL},
      {33, 0x62c9fd21ed857664ULL, 0x5a23927b0946b212ULL},
      {63, 0x5c320a0d2707057fULL, 0x60148113d74960d3ULL},
      {64, 0x7bbabbc45729d17eULL, 0xeeff42e996f0f7d5ULL},
      {65, 0xf3980c34bae65dc1ULL, 0x9d282e6e33ed77c1ULL},
      {100, 0xefa0ad2d3e70c151ULL, 0x4f2e446ab943e539ULL},
      {1000, 0x99594f4828043d35ULL, 0xcbd42ae414e71a03ULL},
      {4099, 0x98531e44aa4f969dULL, 0x32690d40e6bf80dbULL},
  };
  CHECK(io::xxh64(std::as_bytes(std::span(std::string_view("abc")))) == 0x44bc2cf5ad770999ULL);
  for (const auto& c : cases) {
    CAPTURE(c.length);
    std::vector<std::byte> data(c.length);
    for (std::size_t i = 0; i < c.length; ++i) data[i] = std::byte((31 * i + 7) & 0xFFU);
    CHECK(io::xxh64(data) == c.seed0);
    CHECK(io::xxh64(data, 12345) == c.seed12345);
    for (const std::size_t piece : {1U, 5U, 31U, 32U, 33U, 100U}) {
      io::xxh64_state s(12345);
      for (std::size_t at = 0; at < data.size(); at += piece) {
        s.update(std::span(data).subspan(at, std::min<std::size_t>(piece, data.size() - at)));
      }
      CHECK(s.digest() == c.seed12345);
    }
  }
  std::uint64_t back = 0;
  CHECK(io::parse_checksum(io::format_checksum(0x0123456789abcdefULL), back));
  CHECK(back == 0x0123456789abcdefULL);
  CHECK(io::format_checksum(0x0123456789abcdefULL) == "xxh64:0123456789abcdef");
  CHECK_FALSE(io::parse_checksum("xxh64:0123456789abcdeF", back));
  CHECK_FALSE(io::parse_checksum("crc32:0123456789abcdef", back));
}

TEST_CASE("records: what a rank writes, and partial layouts refused") {
  world_mesh m(MPI_COMM_WORLD, {-1});
  auto rep = make<tensor<float, world_mesh, "vm">>(m, ln_ext, 2);
  auto split_v = make<tensor<float, world_mesh, "vm", layout<split<'v', "dp">>>>(m, wte_ext, 1);
  const io::tensor_record r = io::record("ln", rep);
  CHECK(r.writes == (m.coord(0) == 0));
  CHECK(r.layout == "replicate");
  CHECK(r.dims == "vm");
  CHECK(r.type == dtype::f32);
  CHECK(r.bytes.size() == rep.local_count() * sizeof(float));
  CHECK_FALSE(r.read_only);
  const io::tensor_record s = io::record("wte", split_v);
  CHECK(s.writes);
  CHECK(s.layout == "split(v:dp)");
  CHECK(s.local_offsets[0] == split_v.local_offsets()[0]);
  const auto& c = std::as_const(split_v);
  CHECK(io::record("wte", c).read_only);

  tensor<float, world_mesh, "vm", layout<partial<"dp">>> p(m, {3, 4});
  const std::string what = thrown<shape_error>([&] { (void)io::record("grad", p); });
  CHECK(has(what, "reduce it first"));
  CHECK(has(what, "grad"));
}

TEST_CASE("save on the world mesh, load into the same and other layouts, bit-exact") {
  world_mesh m(MPI_COMM_WORLD, {-1});
  shared_dir dir("layouts");
  saved_model<world_mesh> model(m);
  io::checkpoint_info info;
  info.step = 10;
  info.metadata = json::parse(R"({"zero_stage": 2, "lr": 0.0003, "model": {"layers": 2}})");
  const auto recs = model.records();
  io::save_checkpoint(dir.path(), m, recs, info);

  const io::checkpoint_info read = io::read_checkpoint_info(dir.path());
  CHECK(read.step == 10);
  CHECK(read.metadata == info.metadata);
  CHECK(read.world_size == world().size);
  CHECK(read.mesh == m.describe());
  for (const auto& name : file_names(dir.path())) {
    CAPTURE(name);
    CHECK(name.find(".tmp") == std::string::npos);
  }

  SUBCASE("same layouts") {
    same_layouts<world_mesh> into(m);
    const auto got = io::load_checkpoint(dir.path(), m, into.records());
    CHECK(got.step == 10);
    CHECK(got.metadata == info.metadata);
    CHECK(into.wrong() == 0);
  }
  SUBCASE("other layouts, also read in small pieces") {
    for (const std::size_t piece : {std::size_t{8} << 20U, std::size_t{1}, std::size_t{13}}) {
      CAPTURE(piece);
      const chunk_bytes knob(piece);
      other_layouts<world_mesh> into(m);
      CHECK(into.wrong() > 0);  // the comparison sees a tensor that was not loaded
      io::load_checkpoint(dir.path(), m, into.records());
      CHECK(into.wrong() == 0);
    }
  }
  SUBCASE("replicated") {
    replicated_layouts<world_mesh> into(m);
    io::load_checkpoint(dir.path(), m, into.records());
    CHECK(into.wrong() == 0);
  }
  SUBCASE("the list in another order") {
    other_layouts<world_mesh> into(m);
    auto r = into.records();
    std::reverse(r.begin(), r.end());
    io::load_checkpoint(dir.path(), m, r);
    CHECK(into.wrong() == 0);
  }
}

TEST_CASE("an asynchronous save: committed by wait(), its shards taken before written() returns") {
  world_mesh m(MPI_COMM_WORLD, {-1});
  shared_dir dir("async");
  saved_model<world_mesh> model(m);
  io::checkpoint_info info;
  info.step = 1;
  io::save_checkpoint(dir.path(), m, model.records(), info);

  // Step 2 in the background: until wait(), the folder holds step 1.
  info.step = 2;
  info.metadata = json::parse(R"({"async": true})");
  {
    io::pending_save pending = io::save_checkpoint_async(dir.path(), m, model.records(), info);
    CHECK(pending.pending());
    pending.written();
    CHECK(io::read_checkpoint_info(dir.path()).step == 1);
    // After written() the tensors may change: the checkpoint keeps what they held.
    for (const auto b :
         {std::as_writable_bytes(model.wte.local()), std::as_writable_bytes(model.ln.local())}) {
      std::memset(b.data(), 0, b.size());
    }
    pending.wait();
    CHECK_FALSE(pending.pending());
    pending.wait();  // nothing pending: nothing to do
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const io::checkpoint_info read = io::read_checkpoint_info(dir.path());
  CHECK(read.step == 2);
  CHECK(read.metadata == info.metadata);
  {
    other_layouts<world_mesh> into(m);
    io::load_checkpoint(dir.path(), m, into.records());
    CHECK(into.wrong() == 0);
  }
  for (const auto& name : file_names(dir.path())) {
    CAPTURE(name);
    CHECK(name.find(".tmp") == std::string::npos);
    CHECK(name.find("step-00000001") == std::string::npos);  // the old generation removed
  }

  // Abandoned without wait(): the folder keeps step 2; the next save removes the leftover.
  saved_model<world_mesh> fresh(m);
  info.step = 3;
  { io::pending_save dropped = io::save_checkpoint_async(dir.path(), m, fresh.records(), info); }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(io::read_checkpoint_info(dir.path()).step == 2);
  info.step = 4;
  io::pending_save next = io::save_checkpoint_async(dir.path(), m, fresh.records(), info);
  next.wait();
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0 removes the stale files after the commit
  for (const auto& name : file_names(dir.path())) {
    CAPTURE(name);
    CHECK((name == "manifest.json" || name.find("step-00000004") == 0));
  }
  same_layouts<world_mesh> into(m);
  io::load_checkpoint(dir.path(), m, into.records());
  CHECK(into.wrong() == 0);

  // Pipelined as a training loop does: save 5's manifest written beside save 6's shards,
  // whose files that commit's cleanup leaves alone; a second commit into the folder before
  // the first was waited for is refused on every rank.
  info.step = 5;
  io::pending_save five = io::save_checkpoint_async(dir.path(), m, model.records(), info);
  five.start_commit();
  info.step = 6;
  io::pending_save six = io::save_checkpoint_async(dir.path(), m, fresh.records(), info);
  CHECK_THROWS_WITH_AS(six.start_commit(), doctest::Contains("has started its commit"),
                       shape_error);
  CHECK_FALSE(six.pending());
  five.wait();
  CHECK(io::read_checkpoint_info(dir.path()).step == 5);
  info.step = 7;
  io::pending_save seven = io::save_checkpoint_async(dir.path(), m, fresh.records(), info);
  seven.written();
  seven.start_commit();
  seven.wait();
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(io::read_checkpoint_info(dir.path()).step == 7);
  for (const auto& name : file_names(dir.path())) {
    CAPTURE(name);
    CHECK((name == "manifest.json" || name.find("step-00000007") == 0));
  }
  {
    same_layouts<world_mesh> again(m);
    io::load_checkpoint(dir.path(), m, again.records());
    CHECK(again.wrong() == 0);
  }

  // Bad records are refused at once, on every rank; nothing is pending.
  auto bad = fresh.records();
  bad[1].name = bad[0].name;
  CHECK_THROWS_AS((void)io::save_checkpoint_async(dir.path(), m, bad, info), shape_error);
  CHECK(io::read_checkpoint_info(dir.path()).step == 7);
}

TEST_CASE("resharding across rank counts within one job") {
  const int n = world().size;
  world_mesh m(MPI_COMM_WORLD, {-1});
  one_mesh alone;

  SUBCASE("saved by N ranks, loaded by each rank alone") {
    shared_dir dir("n-to-1");
    saved_model<world_mesh> model(m);
    io::save_checkpoint(dir.path(), m, model.records(), at_step(3));
    replicated_layouts<one_mesh> into(alone);
    const auto info = io::load_checkpoint(dir.path(), alone, into.records());
    CHECK(info.world_size == n);
    CHECK(into.wrong() == 0);
  }
  SUBCASE("saved by rank 0 alone, loaded by N ranks sharded") {
    shared_dir dir("1-to-n");
    if (world().rank == 0) {
      saved_model<one_mesh> model(alone);
      io::save_checkpoint(dir.path(), alone, model.records(), at_step(4));
    }
    barrier();
    other_layouts<world_mesh> into(m);
    const auto info = io::load_checkpoint(dir.path(), m, into.records());
    CHECK(info.world_size == 1);
    CHECK(info.step == 4);
    CHECK(into.wrong() == 0);
    same_layouts<world_mesh> again(m);
    io::load_checkpoint(dir.path(), m, again.records());
    CHECK(again.wrong() == 0);
  }
}

TEST_CASE("2-D meshes: split over both axes, loaded on 2-D, 1-D and one-rank meshes") {
  constexpr std::array<std::size_t, 2> a_ext{11, 5};
  constexpr std::array<std::size_t, 3> b_ext{5, 7, 3};
  constexpr std::array<std::size_t, 2> c_ext{4, 9};
  using a_nested = tensor<float, grid_mesh, "ab", layout<split<'a', "dp", "tp">>>;
  using b_both = tensor<double, grid_mesh, "abc", layout<split<'a', "dp">, split<'c', "tp">>>;
  using c_tp = tensor<std::int32_t, grid_mesh, "ab", layout<split<'b', "tp">>>;  // dp copies
  using a_back = tensor<float, grid_mesh, "ab", layout<split<'b', "tp", "dp">>>;
  using b_back = tensor<double, grid_mesh, "abc", layout<split<'b', "tp">>>;
  using c_back = tensor<std::int32_t, grid_mesh, "ab", layout<split<'a', "dp">>>;
  world_mesh flat(MPI_COMM_WORLD, {-1});
  one_mesh alone;
  for (const auto& shape : zest::testing::mesh_shapes()) {
    grid_mesh m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    shared_dir dir("grid");
    auto a = make<a_nested>(m, a_ext, 11);
    auto b = make<b_both>(m, b_ext, 12);
    auto c = make<c_tp>(m, c_ext, 13);
    const std::vector<io::tensor_record> saved{io::record("a", a), io::record("b", b),
                                               io::record("c", c)};
    CHECK(saved[2].writes == (m.coord(0) == 0));
    io::save_checkpoint(dir.path(), m, saved, at_step(7));
    // c's copies along dp are written once: one block per tp coordinate.
    const json::value manifest = json::parse(read_bytes(dir.path() / "manifest.json"));
    CHECK(manifest["tensors"][2]["blocks"].size() == static_cast<std::size_t>(m.size(1)));
    CHECK(manifest["tensors"][0]["blocks"].size() == static_cast<std::size_t>(world().size));
    {
      auto a2 = sentinel<a_back>(m, a_ext);
      auto b2 = sentinel<b_back>(m, b_ext);
      auto c2 = sentinel<c_back>(m, c_ext);
      io::load_checkpoint(
          dir.path(), m,
          std::vector{io::record("a", a2), io::record("b", b2), io::record("c", c2)});
      CHECK(wrong_bits(a2, 11) == 0);
      CHECK(wrong_bits(b2, 12) == 0);
      CHECK(wrong_bits(c2, 13) == 0);
    }
    {
      auto a2 = sentinel<tensor<float, world_mesh, "ab", layout<split<'a', "dp">>>>(flat, a_ext);
      auto b2 = sentinel<tensor<double, world_mesh, "abc", layout<split<'c', "dp">>>>(flat, b_ext);
      auto c2 = sentinel<tensor<std::int32_t, world_mesh, "ab">>(flat, c_ext);
      io::load_checkpoint(
          dir.path(), flat,
          std::vector{io::record("a", a2), io::record("b", b2), io::record("c", c2)});
      CHECK(wrong_bits(a2, 11) == 0);
      CHECK(wrong_bits(b2, 12) == 0);
      CHECK(wrong_bits(c2, 13) == 0);
    }
    {
      auto a2 = sentinel<tensor<float, one_mesh, "ab">>(alone, a_ext);
      auto b2 = sentinel<tensor<double, one_mesh, "abc">>(alone, b_ext);
      auto c2 = sentinel<tensor<std::int32_t, one_mesh, "ab">>(alone, c_ext);
      io::load_checkpoint(
          dir.path(), alone,
          std::vector{io::record("a", a2), io::record("b", b2), io::record("c", c2)});
      CHECK(wrong_bits(a2, 11) == 0);
      CHECK(wrong_bits(b2, 12) == 0);
      CHECK(wrong_bits(c2, 13) == 0);
    }
  }
}

TEST_CASE("a vocabulary-sized tensor over uneven blocks, loaded across layouts") {
  // 50257 rows over 4 ranks: 12565, 12564, 12564, 12564.
  constexpr std::array<std::size_t, 2> ext{50257, 3};
  world_mesh m(MPI_COMM_WORLD, {-1});
  shared_dir dir("vocab");
  auto t = make<tensor<bfloat16, world_mesh, "vm", layout<split<'v', "dp">>>>(m, ext, 21);
  io::save_checkpoint(dir.path(), m, std::vector{io::record("wte", t)}, at_step(1));
  auto u = sentinel<tensor<bfloat16, world_mesh, "vm", layout<split<'m', "dp">>>>(m, ext);
  io::load_checkpoint(dir.path(), m, std::vector{io::record("wte", u)});
  CHECK(wrong_bits(u, 21) == 0);
}

TEST_CASE("corrupt, truncated and mismatching checkpoints are refused, nothing loaded") {
  world_mesh m(MPI_COMM_WORLD, {-1});
  shared_dir dir("refuse");
  saved_model<world_mesh> model(m);
  io::checkpoint_info info = at_step(10);
  info.metadata["loss_scaler"]["scale"] = 1024.5;
  io::save_checkpoint(dir.path(), m, model.records(), info);
  const fs::path manifest = dir.path() / "manifest.json";
  const std::string manifest_text = read_bytes(manifest);
  // Rank 0's shard: the first file the manifest lists, "step-00000010.gen-<id>.rank-0000.bin".
  const std::string shard0_name = json::parse(manifest_text)["files"][0]["file"].as_string();
  REQUIRE(has(shard0_name, "step-00000010.gen-"));
  REQUIRE(has(shard0_name, ".rank-0000.bin"));
  const fs::path shard0 = dir.path() / shard0_name;
  const std::string shard_bytes = read_bytes(shard0);
  REQUIRE(!shard_bytes.empty());
  REQUIRE(!manifest_text.empty());
  other_layouts<world_mesh> into(m);

  // Rank 0 changes a file, everyone loads (and must throw), rank 0 puts the file back.
  auto refuse = [&](const fs::path& file, const std::string& changed) {
    barrier();
    if (world().rank == 0) write_bytes(file, changed);
    barrier();
    const std::string what =
        thrown<checkpoint_error>([&] { io::load_checkpoint(dir.path(), m, into.records()); });
    CHECK(into.untouched_all());
    barrier();
    if (world().rank == 0) write_bytes(file, file == shard0 ? shard_bytes : manifest_text);
    barrier();
    return what;
  };

  SUBCASE("a flipped bit in a shard file") {
    std::string bad = shard_bytes;
    bad[0] = static_cast<char>(bad[0] ^ 0x10);  // the first block rank 0 wrote: wte's
    const std::string what = refuse(shard0, bad);
    CHECK(has(what, "checksum mismatch"));
    CHECK(has(what, shard0_name));
    CHECK(has(what, "\"wte\""));
  }
  SUBCASE("a flipped bit late in a shard file") {
    std::string bad = shard_bytes;
    bad[bad.size() - 1] = static_cast<char>(bad[bad.size() - 1] ^ 0x01);  // idx's block
    const std::string what = refuse(shard0, bad);
    CHECK(has(what, "checksum mismatch"));
    CHECK(has(what, "\"idx\""));
  }
  SUBCASE("a truncated shard file") {
    const std::string what = refuse(shard0, shard_bytes.substr(0, shard_bytes.size() - 1));
    CHECK(has(what, "truncated"));
    CHECK(has(what, shard0_name));
  }
  SUBCASE("a truncated manifest") {
    const std::string what = refuse(manifest, manifest_text.substr(0, manifest_text.size() / 2));
    CHECK(has(what, "manifest.json"));
    CHECK(has(what, "not valid JSON"));
  }
  SUBCASE("a corrupted manifest") {
    std::string bad = manifest_text;
    bad[bad.find("\"tensors\"")] = '?';
    CHECK(has(refuse(manifest, bad), "not valid JSON"));
  }
  // Changed manifests, sealed again (a checksum of their new content) so that the checks
  // behind the manifest's own checksum are reached.
  SUBCASE("a manifest that parses but lies about a file's size") {
    json::value v = json::parse(manifest_text);
    v["files"][0]["bytes"] = v["files"][0]["bytes"].as_int() + 8;
    const std::string what = refuse(manifest, sealed(std::move(v)));
    CHECK(has(what, "the manifest says"));
  }
  SUBCASE("a manifest whose block lies outside the tensor") {
    json::value v = json::parse(manifest_text);
    v["tensors"][0]["blocks"][0]["box_offsets"][0] = 1000;
    CHECK(has(refuse(manifest, sealed(std::move(v))), "does not fit the extents"));
  }
  SUBCASE("a manifest of a newer format") {
    json::value v = json::parse(manifest_text);
    v["version"] = io::checkpoint_format_version + 1;
    CHECK(has(refuse(manifest, sealed(std::move(v))), "version is 3; this build reads version 2"));
  }
  SUBCASE("a manifest of format version 1 (no checksum of its own)") {
    json::value v = json::parse(manifest_text);
    v["version"] = 1;
    json::object& members = v.as_object();
    members.pop_back();  // "manifest_checksum" is the last member
    CHECK(has(refuse(manifest, json::dump(v, 1)), "version is 1; this build reads version 2"));
  }
  SUBCASE("a manifest missing a block") {
    json::value v = json::parse(manifest_text);
    json::value& blocks = v["tensors"][0]["blocks"];
    json::array kept(blocks.as_array().begin() + 1, blocks.as_array().end());
    blocks = json::value(std::move(kept));
    CHECK(has(refuse(manifest, sealed(std::move(v))), "data is missing"));
  }
  // One changed digit of a field that no other check covers: only the manifest's own
  // checksum sees it.
  SUBCASE("a changed digit in step, world_size or the metadata") {
    for (const auto& [field, before, after] :
         {std::array<std::string, 3>{"step", "\"step\": 10", "\"step\": 19"},
          std::array<std::string, 3>{"world_size", "\"world_size\": ", "\"world_size\": 9"},
          std::array<std::string, 3>{"metadata", "\"scale\": 1024.5", "\"scale\": 1034.5"}}) {
      CAPTURE(field);
      REQUIRE(has(manifest_text, before));
      std::string bad = manifest_text;
      bad.replace(bad.find(before), before.size(), after);
      const std::string what = refuse(manifest, bad);
      CHECK(has(what, "manifest.json: manifest_checksum is xxh64:"));
      CHECK(has(what, "the manifest was changed or is corrupt"));
    }
  }
  SUBCASE("a manifest without its checksum") {
    json::value v = json::parse(manifest_text);
    v.as_object().pop_back();
    CHECK(has(refuse(manifest, json::dump(v, 1)), "manifest_checksum is missing"));
  }
  SUBCASE("no manifest") {
    barrier();
    if (world().rank == 0) fs::remove(manifest);
    barrier();
    const std::string what =
        thrown<checkpoint_error>([&] { io::load_checkpoint(dir.path(), m, into.records()); });
    CHECK(has(what, "manifest.json is missing"));
    CHECK(into.untouched_all());
    CHECK_THROWS_AS(io::read_checkpoint_info(dir.path()), checkpoint_error);
    barrier();
    if (world().rank == 0) write_bytes(manifest, manifest_text);
    barrier();
  }
  SUBCASE("a model with another extent") {
    auto wte = sentinel<tensor<float, world_mesh, "vm">>(m, {104, 6});
    auto r = into.records();
    r[0] = io::record("wte", wte);
    const std::string what =
        thrown<checkpoint_error>([&] { io::load_checkpoint(dir.path(), m, r); });
    CHECK(has(what, "does not match the model"));
    CHECK(has(what, "\"wte\""));
    CHECK(has(what, "[103, 6]"));
    CHECK(has(what, "[104, 6]"));
    CHECK(untouched(wte));
  }
  SUBCASE("a model with another dtype") {
    auto w = sentinel<tensor<float, world_mesh, "ab">>(m, w_ext);
    auto r = into.records();
    r[2] = io::record("w", w);
    const std::string what =
        thrown<checkpoint_error>([&] { io::load_checkpoint(dir.path(), m, r); });
    CHECK(has(what, "does not match the model"));
    CHECK(has(what, "dtype double in the checkpoint, float in the model"));
    CHECK(untouched(w));
  }
  SUBCASE("a model lacking a tensor") {
    auto r = into.records();
    r.pop_back();
    const std::string what =
        thrown<checkpoint_error>([&] { io::load_checkpoint(dir.path(), m, r); });
    CHECK(has(what, "\"idx\" is in the checkpoint but not in the model"));
  }
  SUBCASE("a model with an extra tensor") {
    auto extra = sentinel<tensor<float, world_mesh, "vm">>(m, {2, 2});
    auto r = into.records();
    r.push_back(io::record("extra", extra));
    const std::string what =
        thrown<checkpoint_error>([&] { io::load_checkpoint(dir.path(), m, r); });
    CHECK(has(what, "\"extra\" is in the model but not in the checkpoint"));
    CHECK(untouched(extra));
  }
  SUBCASE("a const tensor cannot be loaded into") {
    const auto& c = std::as_const(into.wte);
    auto r = into.records();
    r[0] = io::record("wte", c);
    CHECK_THROWS_AS(io::load_checkpoint(dir.path(), m, r), shape_error);
  }
  CHECK(into.untouched_all());

  // After every refusal the checkpoint (restored) still loads.
  io::load_checkpoint(dir.path(), m, into.records());
  CHECK(into.wrong() == 0);
}

TEST_CASE("bad saves throw on every rank") {
  world_mesh m(MPI_COMM_WORLD, {-1});
  shared_dir dir("bad-save");
  saved_model<world_mesh> model(m);

  SUBCASE("a name twice") {
    auto r = model.records();
    r[1].name = "wte";
    CHECK(has(thrown<shape_error>([&] { io::save_checkpoint(dir.path(), m, r, {}); }),
              "appears twice"));
  }
  SUBCASE("ranks passing different lists") {
    auto r = model.records();
    if (world().rank == world().size - 1 && world().size > 1) r.pop_back();
    if (world().size > 1) {
      CHECK(has(thrown<shape_error>([&] { io::save_checkpoint(dir.path(), m, r, {}); }),
                "different tensor lists"));
    }
  }
  SUBCASE("a folder that cannot be made (rank 0 fails, all throw)") {
    const fs::path blocker = dir.path() / "a-file";
    if (world().rank == 0) write_bytes(blocker, "x");
    barrier();
    CHECK(has(thrown<checkpoint_error>(
                  [&] { io::save_checkpoint(blocker / "ckpt", m, model.records(), {}); }),
              "cannot create the folder"));
  }
  SUBCASE("a negative step") {
    CHECK_THROWS_AS(io::save_checkpoint(dir.path(), m, model.records(), at_step(-1)), shape_error);
  }
  CHECK_FALSE(fs::exists(dir.path() / "manifest.json"));
}

TEST_CASE("saving a newer step replaces the older checkpoint atomically") {
  world_mesh m(MPI_COMM_WORLD, {-1});
  one_mesh alone;
  shared_dir dir("replace");
  {
    saved_model<world_mesh> model(m);
    io::save_checkpoint(dir.path(), m, model.records(), at_step(10));
  }
  barrier();
  std::size_t step10_files = 0;
  for (const auto& name : file_names(dir.path())) step10_files += has(name, "step-00000010");
  CHECK(step10_files >= 1);
  barrier();

  // Step 20 holds other values: each tensor's salt + 100.
  auto w = make<tensor<double, world_mesh, "ab", layout<split<'a', "dp">>>>(m, w_ext, 103);
  io::save_checkpoint(dir.path(), m, std::vector{io::record("w", w)}, at_step(20));
  barrier();
  for (const auto& name : file_names(dir.path())) {
    CAPTURE(name);
    CHECK_FALSE(has(name, ".tmp"));
    CHECK_FALSE(has(name, "step-00000010"));
  }
  CHECK(io::read_checkpoint_info(dir.path()).step == 20);
  auto back = sentinel<tensor<double, one_mesh, "ab">>(alone, w_ext);
  io::load_checkpoint(dir.path(), alone, std::vector{io::record("w", back)});
  CHECK(wrong_bits(back, 103) == 0);
}

// ---------------------------------------------------------------------------------------
// Atomic saves: the same step again, I/O errors on one rank (tests/io/checkpoint_fault.cpp
// goes through every file operation of a save, with crashes as well).

// The files a checkpoint consists of: its manifest and the shard files it names.
std::set<std::string> files_of_checkpoint(const fs::path& dir) {
  std::set<std::string> out{"manifest.json"};
  const json::value manifest = json::parse(read_bytes(dir / "manifest.json"));
  for (const auto& f : manifest["files"].as_array()) out.insert(f["file"].as_string());
  return out;
}
std::set<std::string> files_in(const fs::path& dir) {
  const auto names = file_names(dir);
  return {names.begin(), names.end()};
}
io::checkpoint_info labelled(std::int64_t step, std::string_view which) {
  io::checkpoint_info info = at_step(step);
  info.metadata["which"] = which;
  return info;
}
std::string which_checkpoint(const fs::path& dir) {
  return io::read_checkpoint_info(dir).metadata["which"].as_string();
}

using w_split_a = tensor<double, world_mesh, "ab", layout<split<'a', "dp">>>;

// Makes the (skip + 1)-th operation `op` on rank `rank` whose file name contains `part`
// fail with EIO, while it is alive.
struct injected_eio {
  static inline int rank = -1, skip = 0, hits = 0;
  static inline zest::detail::file_op op{};
  static inline std::string part;
  static int hook(zest::detail::file_op o, const fs::path& path) {
    if (world().rank != rank || o != op || !has(path.filename().string(), part)) return 0;
    if (skip-- > 0) return 0;
    ++hits;
    return EIO;
  }
  injected_eio(int r, zest::detail::file_op o, std::string p, int s = 0) {
    rank = r;
    op = o;
    part = std::move(p);
    skip = s;
    hits = 0;
    zest::detail::file_fault() = &hook;
  }
  injected_eio(const injected_eio&) = delete;
  injected_eio& operator=(const injected_eio&) = delete;
  ~injected_eio() { zest::detail::file_fault() = nullptr; }
};

TEST_CASE("re-saving the same step replaces the checkpoint; only the new files remain") {
  world_mesh m(MPI_COMM_WORLD, {-1});
  one_mesh alone;
  shared_dir dir("same-step");
  {
    saved_model<world_mesh> model(m);
    io::save_checkpoint(dir.path(), m, model.records(), labelled(10, "first"));
  }
  barrier();
  const std::set<std::string> first = files_of_checkpoint(dir.path());
  CHECK(files_in(dir.path()) == first);
  barrier();

  auto w = make<w_split_a>(m, w_ext, 103);
  io::save_checkpoint(dir.path(), m, std::vector{io::record("w", w)}, labelled(10, "second"));
  barrier();
  const std::set<std::string> second = files_of_checkpoint(dir.path());
  CHECK(files_in(dir.path()) == second);
  for (const auto& name : second) {
    CAPTURE(name);
    CHECK((name == "manifest.json" || !first.contains(name)));  // a new generation's names
  }
  CHECK(which_checkpoint(dir.path()) == "second");
  auto back = sentinel<tensor<double, one_mesh, "ab">>(alone, w_ext);
  io::load_checkpoint(dir.path(), alone, std::vector{io::record("w", back)});
  CHECK(wrong_bits(back, 103) == 0);
}

TEST_CASE("an I/O error on one rank: every rank throws, never a broken checkpoint") {
  using zest::detail::file_op;
  world_mesh m(MPI_COMM_WORLD, {-1});
  one_mesh alone;
  shared_dir dir("eio");
  const int last = world().size - 1;
  {
    saved_model<world_mesh> model(m);
    io::save_checkpoint(dir.path(), m, model.records(), labelled(10, "old"));
  }
  barrier();
  const std::set<std::string> old_files = files_of_checkpoint(dir.path());
  barrier();
  auto w = make<w_split_a>(m, w_ext, 103);
  const std::vector<io::tensor_record> new_records{io::record("w", w)};
  auto failed_save = [&](int rank, file_op op, const std::string& part, int skip) {
    injected_eio fault(rank, op, part, skip);
    const std::string what = thrown<checkpoint_error>(
        [&] { io::save_checkpoint(dir.path(), m, new_records, labelled(10, "new")); });
    CHECK(injected_eio::hits == (world().rank == rank ? 1 : 0));
    CHECK(has(what, "zest: save_checkpoint: "));
    CHECK(has(what, "Input/output error"));
    if (world().size > 1) CHECK(has(what, zest::detail::message("[on rank ", rank, "]")));
    barrier();
  };
  auto old_loads = [&] {
    CHECK(which_checkpoint(dir.path()) == "old");
    other_layouts<world_mesh> into(m);
    io::load_checkpoint(dir.path(), m, into.records());
    CHECK(into.wrong() == 0);
  };
  auto new_loads = [&] {
    CHECK(which_checkpoint(dir.path()) == "new");
    auto back = sentinel<tensor<double, one_mesh, "ab">>(alone, w_ext);
    io::load_checkpoint(dir.path(), alone, std::vector{io::record("w", back)});
    CHECK(wrong_bits(back, 103) == 0);
  };

  SUBCASE("the last rank's shard cannot be renamed: its file and the others' are removed") {
    failed_save(last, file_op::rename, ".rank-", 0);
    CHECK(files_in(dir.path()) == old_files);
    old_loads();
  }
  SUBCASE("rank 0's manifest cannot be flushed: the old checkpoint stays") {
    failed_save(0, file_op::fsync, "manifest.json", 0);
    old_loads();
  }
  SUBCASE("rank 0's folder flush after the manifest's rename: the new one is in place") {
    // Rank 0 flushes the folder twice: after its shard's rename, after the manifest's.
    failed_save(0, file_op::fsync_folder, "", 1);
    new_loads();
  }
  // Whatever the failure left, the next save leaves exactly its own files.
  barrier();
  io::save_checkpoint(dir.path(), m, new_records, labelled(11, "new"));
  barrier();
  CHECK(files_in(dir.path()) == files_of_checkpoint(dir.path()));
  new_loads();
}

TEST_CASE("load_checkpoint's accept refuses from the manifest, before anything is read") {
  world_mesh m(MPI_COMM_WORLD, {-1});
  shared_dir dir("accept");
  {
    saved_model<world_mesh> model(m);
    io::save_checkpoint(dir.path(), m, model.records(), labelled(10, "a"));
  }
  other_layouts<world_mesh> into(m);
  auto want = [](std::string which, int on_rank) {
    return [which, on_rank](const io::checkpoint_info& info) {
      if ((on_rank < 0 || world().rank == on_rank) && info.metadata["which"].as_string() != which)
        throw checkpoint_error(zest::detail::message("zest: test: checkpoint ",
                                                     info.metadata["which"].as_string(),
                                                     ", wanted ", which, " at step ", info.step));
    };
  };
  CHECK(has(thrown<checkpoint_error>(
                [&] { io::load_checkpoint(dir.path(), m, into.records(), want("b", -1)); }),
            "checkpoint a, wanted b at step 10"));
  CHECK(into.untouched_all());
  // One rank refuses: every rank throws.
  const std::string what = thrown<checkpoint_error>(
      [&] { io::load_checkpoint(dir.path(), m, into.records(), want("b", world().size - 1)); });
  CHECK(has(what, "wanted b"));
  CHECK(into.untouched_all());
  io::load_checkpoint(dir.path(), m, into.records(), want("a", -1));
  CHECK(into.wrong() == 0);
}

}  // namespace
