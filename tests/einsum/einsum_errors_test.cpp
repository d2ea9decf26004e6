// einsum's run-time shape errors: operands whose extents disagree on a dim throw
// zest::shape_error naming the spec, the dim letter, both extents and both operands. The
// check runs before any collective, so every rank throws, and the next einsum still works.
#include <doctest/doctest.h>
#include <mpi.h>

#include <array>
#include <string>
#include <vector>

#include "support/fixtures.hpp"
#include "zest/einsum/einsum.hpp"
#include "zest/tensor/redistribute.hpp"

namespace {
using namespace zest;
using namespace zest::testing;
using mesh_t = mesh<"dp", "tp">;

// The message of the shape_error that f throws ("" if it throws none).
template <class F>
std::string shape_error_of(F&& f) {
  try {
    f();
  } catch (const shape_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("einsum: a contracted dim with two extents throws shape_error") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    {
      const tensor<float, mesh_t, "ik"> a(m, {2, 3});
      const tensor<float, mesh_t, "kj"> b(m, {4, 5});
      const std::string what = shape_error_of([&] { (void)einsum<"ik,kj->ij">(a, b); });
      CAPTURE(what);
      CHECK(contains(what, "zest: einsum"));
      CHECK(contains(what, "\"ik,kj->ij\""));
      CHECK(contains(what, "dim 'k'"));
      CHECK(contains(what, "extent 3 in operand 0"));
      CHECK(contains(what, "but 4 in operand 1"));
      CHECK_THROWS_AS((void)einsum<"ik,kj->ij">(a, b), shape_error);
    }
    {
      // Sharded operands: the check uses global extents, before any redistribution.
      using x_t = tensor<double, mesh_t, "bsm", layout<split<'b', "dp">>>;
      using w_t = tensor<double, mesh_t, "mh", layout<split<'m', "tp">>>;
      const x_t x(m, {4, 3, 8});
      const w_t w(m, {6, 5});
      m.reset_stats();
      const std::string what = shape_error_of([&] { (void)einsum<"bsm,mh->bsh">(x, w); });
      CAPTURE(what);
      CHECK(contains(what, "\"bsm,mh->bsh\""));
      CHECK(contains(what, "dim 'm'"));
      CHECK(contains(what, "extent 8 in operand 0"));
      CHECK(contains(what, "but 6 in operand 1"));
      CHECK(m.stats().calls() == 0);  // nothing was sent
    }
  }
}

TEST_CASE("einsum: a batch dim with two extents throws shape_error") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    const tensor<float, mesh_t, "bik", layout<split<'i', "dp">>> a(m, {2, 3, 4});
    const tensor<float, mesh_t, "bkj"> b(m, {3, 4, 5});
    const std::string what = shape_error_of([&] { (void)einsum<"bik,bkj->bij">(a, b); });
    CAPTURE(what);
    CHECK(contains(what, "\"bik,bkj->bij\""));
    CHECK(contains(what, "dim 'b'"));
    CHECK(contains(what, "extent 2 in operand 0"));
    CHECK(contains(what, "but 3 in operand 1"));
  }
}

TEST_CASE("einsum: the first disagreement is reported, with its operands") {
  const mesh_t m(MPI_COMM_WORLD, {-1, 1});
  // k agrees, j does not: operand 1 says 5, operand 0 (transposed, "ji") says 7.
  const tensor<float, mesh_t, "ji"> a(m, {7, 2});
  const tensor<float, mesh_t, "jk"> b(m, {5, 3});
  const std::string what = shape_error_of([&] { (void)einsum<"ji,jk->ik">(a, b); });
  CAPTURE(what);
  CHECK(contains(what, "dim 'j' has extent 7 in operand 0 but 5 in operand 1"));
}

TEST_CASE("einsum: after a shape error every rank can go on") {
  for (const auto& shape : mesh_shapes()) {
    const mesh_t m(MPI_COMM_WORLD, shape);
    CAPTURE(m.describe());
    using a_t = tensor<double, mesh_t, "ik", layout<split<'k', "dp">>>;
    using b_t = tensor<double, mesh_t, "kj", layout<split<'k', "dp">>>;
    const auto bad = a_t::generate(m, {2, 5}, [](const auto&) { return 1.0; });
    const auto b =
        b_t::generate(m, {4, 3}, [](const auto& i) { return static_cast<double>(i[0] + i[1]); });
    CHECK_THROWS_AS((void)einsum<"ik,kj->ij">(bad, b), shape_error);
    // Same layouts, right extents: c[i][j] = sum_k (k + j) = 6 + 4 j.
    const auto a = a_t::generate(m, {2, 4}, [](const auto&) { return 1.0; });
    const auto c = einsum<"ik,kj->ij">(a, b);
    CHECK(to_global(c) == std::vector<double>{6, 10, 14, 6, 10, 14});
  }
}
