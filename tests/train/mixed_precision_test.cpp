// Mixed precision: bfloat16 parameters and gradients with fp32 master weights (ZeRO-3):
// bytes on the wire in bfloat16 equal the formula, model states equal (2+2+K) Psi / N with
// K = 12, and training tracks fp32. float16 with dynamic loss scaling (ZeRO-2): an injected
// inf skips the step on every rank, halves the scale and leaves the parameters alone; the
// next step applies.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "train/training_fixture.hpp"
#include "zest/zero/planner.hpp"

// The suite that CTest's train_mixed_precision_np<N> run (tests/train/CMakeLists.txt: this
// file, zero_stages_test.cpp and checkpoint_test.cpp are one translation unit).
TEST_SUITE_BEGIN("train_mixed_precision");

namespace {
using namespace zest;
using namespace zest::testing;

using bf16_policy = training_policy<world_mesh, zero_stage<3>, bfloat16>;
using fp16_policy = training_policy<world_mesh, zero_stage<2>, float16>;

TEST_CASE("bfloat16 ZeRO-3: bytes, model states and losses") {
  const auto mesh = make_world_mesh();
  const std::int64_t before = memory::live_bytes();
  zero_engine<bf16_policy> engine(mesh, {.seed = 11});
  gpt<bf16_policy> model(engine, small_gpt());
  const std::int64_t states = memory::live_bytes() - before;
  const auto psi = static_cast<std::uint64_t>(engine.parameter_count());
  const auto n = static_cast<std::uint64_t>(mesh.world_size());

  const double formula =
      zero_formula(3, static_cast<double>(psi), static_cast<double>(n), mixed_precision_adam)
          .memory_bytes;
  CHECK(static_cast<double>(states) == doctest::Approx(formula).epsilon(0.05));
  CHECK(static_cast<std::uint64_t>(states) ==
        plan_zero<zero_stage<3>>(model.shape(), mesh, mixed_precision_adam).memory.total());

  auto s = sampler();
  std::vector<double> losses;
  for (std::int64_t k = 0; k < 20; ++k) {
    const auto [in, tg] = s.batch<"dp">(mesh, static_cast<std::size_t>(k));
    const auto r =
        train_step(engine, model, in, tg, learning_rate(k), static_cast<std::uint64_t>(k));
    losses.push_back(r.loss);
    if (k == 0) {
      // 3 Psi (N-1)/N elements of 2 bytes.
      CHECK(r.traffic.bytes_sent() == 3 * (psi * (n - 1) / n) * sizeof(bfloat16));
    }
  }
  CHECK(losses.back() < losses.front() - 0.3);
  CHECK(memory::live_bytes() - before == states);
}

TEST_CASE("float16 loss scaling skips a step with an inf and recovers") {
  const auto mesh = make_world_mesh();
  zero_options o;
  o.seed = 5;
  o.initial_loss_scale = 1024.0F;
  zero_engine<fp16_policy> engine(mesh, o);
  gpt<fp16_policy> model(engine, small_gpt());
  auto s = sampler();

  auto backward_once = [&](std::int64_t k) {
    const auto [in, tg] = s.batch<"dp">(mesh, static_cast<std::size_t>(k));
    autodiff::tape t;
    auto loss = model.loss(t, in, tg);
    engine.backward(loss);
  };

  // A normal step first.
  backward_once(0);
  CHECK(engine.step(1e-3).applied);
  const auto before = parameter_values(engine);
  const float scale = engine.loss_scaler().scale();

  // An inf in one rank's gradient: every rank skips.
  backward_once(1);
  if (mesh.rank() == mesh.world_size() - 1) {
    auto* p = engine.parameters().front();
    p->gradient_buffer()[0] = float16(std::numeric_limits<float>::infinity());
  }
  const auto skipped = engine.step(1e-3);
  CHECK_FALSE(skipped.applied);
  CHECK(engine.loss_scaler().scale() == scale / 2);
  CHECK(engine.loss_scaler().skipped_steps() == 1);
  CHECK(parameter_values(engine) == before);

  // And the next one applies, with the lower scale.
  backward_once(2);
  const auto next = engine.step(1e-3);
  CHECK(next.applied);
  CHECK(next.loss_scale == scale / 2);
  CHECK(std::isfinite(next.grad_norm));
  CHECK(parameter_values(engine) != before);
}

}  // namespace

TEST_SUITE_END();
