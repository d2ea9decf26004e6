// A tensor used after std::move: every use throws zest::shape_error naming the operation and
// saying that the tensor was moved from (it used to hand out an empty shard with its old
// extents, and einsum read past it). einsum names its spec and the operand; redistribute,
// to_global and the accessors name the accessor. A tensor moved into, a moved-from tensor
// assigned again, and a tensor of extent 0 (empty storage, not moved from) all work.
#include <doctest/doctest.h>
#include <mpi.h>

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/mpi_test.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/einsum/einsum.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/tensor/redistribute.hpp"
#include "zest/tensor/tensor.hpp"

namespace {
using namespace zest;
namespace ad = zest::autodiff;

using mesh_t = mesh<"dp">;
using a_t = tensor<float, mesh_t, "ij", layout<split<'i', "dp">>>;
using b_t = tensor<float, mesh_t, "jk", layout<split<'j', "dp">>>;

mesh_t world_mesh() { return mesh_t(MPI_COMM_WORLD, {testing::world().size}); }

// 4 x 3 and 3 x 2 matrices, a(i, j) = i + 10 j, b(j, k) = j - k.
a_t make_a(const mesh_t& m) {
  return a_t::generate(m, {4, 3}, [](const auto& i) { return float(i[0] + 10 * i[1]); });
}
b_t make_b(const mesh_t& m) {
  return b_t::generate(m, {3, 2}, [](const auto& i) { return float(i[0]) - float(i[1]); });
}
std::vector<float> product_reference() {
  std::vector<float> c(8, 0.0F);
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < 2; ++k)
      for (int j = 0; j < 3; ++j) c[i * 2 + k] += float(i + 10 * j) * float(j - k);
  return c;
}

// The message of the shape_error that f throws (fails the test if it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const shape_error& e) {
    return e.what();
  }
  FAIL("no zest::shape_error thrown");
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("einsum with a moved-from operand names the spec, the operand and the move") {
  const auto m = world_mesh();
  auto a = make_a(m);
  auto b = make_b(m);
  const b_t taken = std::move(b);
  CHECK(b.is_moved_from());  // NOLINT(bugprone-use-after-move): the case under test
  CHECK_FALSE(taken.is_moved_from());
  const std::string msg = error_of([&] { (void)einsum<"ij,jk->ik">(a, b); });
  CAPTURE(msg);
  CHECK(contains(msg, "zest: einsum \"ij,jk->ik\": operand 1 (\"jk\")"));
  CHECK(contains(msg, "moved from"));
  // The tensor moved into holds the value.
  CHECK(to_global(einsum<"ij,jk->ik">(a, taken)) == product_reference());

  const a_t a2 = std::move(a);
  const std::string msg0 = error_of([&] { (void)einsum<"ij,jk->ik">(a, taken); });
  CHECK(contains(msg0, "operand 0 (\"ij\")"));
  CHECK(to_global(einsum<"ij,jk->ik">(a2, taken)) == product_reference());
}

TEST_CASE("redistribute, to_global and every accessor of a moved-from tensor throw") {
  const auto m = world_mesh();
  auto a = make_a(m);
  const a_t keep = std::move(a);
  auto check_message = [](const std::string& msg, const std::string& accessor) {
    CAPTURE(msg);
    CHECK(contains(msg, "zest: tensor \"ij\" split(i:dp): " + accessor));
    CHECK(contains(msg, "moved from"));
    CHECK(contains(msg, "Fix:"));
  };
  // NOLINTBEGIN(bugprone-use-after-move): every use below is the case under test
  // (Which accessor redistribute reaches first is its business: the message names it.)
  check_message(error_of([&] { (void)redistribute<layout<>>(a); }), "");
  check_message(error_of([&] { (void)redistribute<layout<>>(std::move(a)); }), "");
  check_message(error_of([&] { (void)to_global(a); }), "");
  check_message(error_of([&] { (void)a.local(); }), "local()");
  check_message(error_of([&] { (void)std::as_const(a).local(); }), "local()");
  check_message(error_of([&] { (void)a.storage(); }), "storage()");
  check_message(error_of([&] { (void)a.local_to_host(); }), "local_to_host()");
  check_message(error_of([&] { (void)a.local_matrix(); }), "local_matrix()");
  check_message(error_of([&] { (void)a.mesh(); }), "mesh()");
  check_message(error_of([&] { (void)a.extents(); }), "extents()");
  check_message(error_of([&] { (void)a.extent('i'); }), "extent()");
  check_message(error_of([&] { (void)a.size(); }), "size()");
  check_message(error_of([&] { (void)a.local_extents(); }), "local_extents()");
  check_message(error_of([&] { (void)a.local_count(); }), "local_count()");
  // A copy of a moved-from tensor is moved-from too; moving it on keeps it so.
  const a_t copy = a;
  check_message(error_of([&] { (void)copy.local(); }), "local()");
  a_t moved_again = std::move(a);
  check_message(error_of([&] { (void)moved_again.local(); }), "local()");
  // Assigning a value makes it usable again.
  a = make_a(m);
  CHECK_FALSE(a.is_moved_from());
  CHECK(to_global(a) == to_global(keep));
  // NOLINTEND(bugprone-use-after-move)
}

TEST_CASE("a tape variable made from a tensor leaves it moved from; extent 0 is not moved") {
  const auto m = world_mesh();
  ad::tape t;
  auto a = make_a(m);
  auto b = make_b(m);
  auto av = t.constant(std::move(a));
  auto bv = t.parameter(b);  // copied: b stays usable
  CHECK(to_global(ad::einsum<"ij,jk->ik">(av, bv).value()) == product_reference());
  CHECK(to_global(einsum<"ij,jk->ik">(av.value(), b)) == product_reference());
  const std::string msg = error_of([&] { (void)einsum<"ij,jk->ik">(a, b); });  // NOLINT
  CHECK(contains(msg, "operand 0 (\"ij\")"));

  // Empty storage alone is not "moved from": a 0 x 3 tensor works.
  const a_t empty(m, {0, 3});
  CHECK_FALSE(empty.is_moved_from());
  CHECK(to_global(einsum<"ij,jk->ik">(empty, b)).empty());
}
