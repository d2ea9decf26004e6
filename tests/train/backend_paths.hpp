// tests/train/backend_paths.hpp — the checks around a training step that once had a host loop
// and a backend loop side by side, run on a mesh of any backend against the host:
//
//   using grad_t = zest::tensor<float, Mesh, "bm", zest::layout<zest::split<'b', "dp">>>;
//   using host_grad_t = zest::tensor<float, zest::mesh<"dp">, "bm", ...the same layout>;
//   zest::testing::check_backend_paths<grad_t, host_grad_t>(mesh);
//
// (tests/train/emulated_training_test.cpp on an emulated mesh, tests/cuda/cuda_training_test.cu
// on a cuda_mesh). The callers name the tensor types at namespace scope: nvcc's host-code
// generator loses a string literal template argument spelt inside a function template.
//
//   - global_norm equals the host's on the same values (small multiples of 1/4: every sum
//     exact, whatever the order);
//   - has_inf_or_nan<Backend> finds one inf written into the shard, and none before;
//   - io::record stages the shard on the host (its bytes are the shard's) and write_back puts
//     a changed value into the shard, which stays where it was;
//   - autodiff::checkpoint's determinism check: a deterministic function passes, one drawing
//     another mask on recomputation is refused.
#pragma once

#include <doctest/doctest.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "zest/autodiff/checkpoint.hpp"
#include "zest/autodiff/ops.hpp"
#include "zest/io/tensor_record.hpp"
#include "zest/optim/clip.hpp"
#include "zest/optim/loss_scaler.hpp"

namespace zest::testing {

// G: a float tensor of dims "bm" on the mesh under test, split over its one axis; H: the
// same on the host mesh of the same shape.
template <class G, class H>
void check_backend_paths(const typename G::mesh_type& m) {
  using B = typename G::backend_type;
  using g_t = G;
  using h_t = H;
  static_assert(std::is_same_v<typename H::backend_type, host_backend>);
  const auto value = [](const auto& i) {
    return 0.25F * static_cast<float>((i[0] * 5 + i[1]) % 9) - 1.0F;
  };
  const std::size_t rows = 8, cols = 37;
  const typename H::mesh_type hm(MPI_COMM_WORLD, {m.world_size()});
  auto g = g_t::generate(m, {rows, cols}, value);
  const auto h = h_t::generate(hm, {rows, cols}, value);

  CHECK(global_norm(m, g) == global_norm(hm, h));

  CHECK_FALSE(has_inf_or_nan<B>(std::span<const float>(g.local())));
  {
    auto poisoned = g;
    if (poisoned.local_count() > 3) {
      B::fill(poisoned.local().data() + 3, 1, std::numeric_limits<float>::infinity());
    }
    CHECK(has_inf_or_nan<B>(std::span<const float>(poisoned.local())) ==
          (poisoned.local_count() > 3));
  }

  {
    const float* shard = g.local().data();
    const auto before = g.local_to_host();
    io::tensor_record r = io::record("g", g);
    REQUIRE(r.bytes.size() == before.size() * sizeof(float));
    CHECK(std::memcmp(r.bytes.data(), before.data(), r.bytes.size()) == 0);
    CHECK_FALSE(r.read_only);
    if (!r.bytes.empty()) {
      const float changed = 42.0F;
      std::memcpy(r.bytes.data(), &changed, sizeof changed);
      if (r.write_back) r.write_back();
      CHECK(g.local_to_host()[0] == changed);
      CHECK(g.local().data() == shard);
      std::memcpy(r.bytes.data(), before.data(), sizeof changed);
      if (r.write_back) r.write_back();
    }
    CHECK(g.local_to_host() == before);
    const io::tensor_record c = io::record("g", std::as_const(g));
    CHECK(c.read_only);
    CHECK(!c.write_back);
    CHECK(std::memcmp(c.bytes.data(), before.data(), c.bytes.size()) == 0);
  }

  namespace ad = zest::autodiff;
  for (const bool deterministic : {true, false}) {
    ad::tape t;
    auto x = t.parameter(g_t(g));
    std::uint64_t calls = 0;
    auto y = ad::checkpoint(
        [&](const ad::variable<g_t>& in) {
          return ad::dropout(in, 0.5, deterministic ? std::uint64_t{7} : ++calls);
        },
        x);
    if (deterministic) {
      CHECK_NOTHROW(ad::backward(ad::sum(y)));
    } else {
      CHECK_THROWS_WITH_AS(ad::backward(ad::sum(y)), doctest::Contains("not deterministic"),
                           std::logic_error);
    }
  }
}

}  // namespace zest::testing
