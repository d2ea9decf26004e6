// custom_layer — a sharded layer of your own, composed the way zest's layers are: a
// Megatron-style tensor-parallel MLP on a 2-D mesh<"dp", "tp">, trained with ZeRO.
//
//   mpiexec -n 4 build/default/examples/custom_layer            # dp=2 x tp=2, ZeRO-3
//   mpiexec -n 4 build/default/examples/custom_layer --tp 4 --zero 0
//   build/default/examples/custom_layer                         # one process: 1 x 1
//
// The layer is y = GELU(x W1 + b1) W2 + b2, W1 split by columns and W2 by rows over tp. It
// names no collective: the parameters' layouts and the einsums imply them, and the ZeRO
// stage adds the data-parallel ones over dp:
//
//   x       "btm" split(b:dp)             activations: batch over dp, whole on tp
//   W1, b1  "mh", "h" split(h:tp)         x W1 + b1: "bth" split(b:dp) split(h:tp), local
//   W2      "hm" split(h:tp)              GELU(.) W2 contracts h: "btm" partial(tp), local
//   reduce  partial(tp) -> replicate      an all-reduce; its backward is one too (the
//                                         gradient of x stays pending: no collective there)
//   b2      "m" replicate                 its gradient is pending over tp: all-reduced
//
// The program then checks, printing OK or MISMATCH (exit code 1 on a mismatch), that
//   1. the losses equal those of the same model on one process (local_mesh, 1 x 1);
//   2. the bytes each mesh axis sends in a step equal what explain() and ZeRO predict;
//   3. each rank stores 1/(dp*tp) of every tp-split parameter under ZeRO-3 (1/tp below).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "zest/nn/linear.hpp"
#include "zest/train/train_step.hpp"
#include "zest/zero/engine.hpp"
#include "zest/zero/parameter.hpp"
#include "zest/zest.hpp"

namespace {

using zest::layout, zest::split, zest::partial;
namespace ad = zest::autodiff;
using mesh_t = zest::mesh<"dp", "tp">;

// X's layout written back as a layout type, e.g. layout<split<'b', "dp">>.
template <class X>
using layout_of = typename zest::layout_type_for<typename X::mesh_type, X::layout>::type;

// ---- The layer: a user's class, templated on the training policy like zest's layers ------
template <zest::training_policy_type P>
class tp_mlp {
 public:
  using on_tp = layout<split<'h', "tp">>;  // Base: placement on the axes other than dp
  using fc_type = zest::linear<P, "btm,mh->bth", "mh", "h", on_tp, on_tp>;  // column-parallel
  using proj_type = zest::linear<P, "bth,hm->btm", "hm", "", on_tp>;        // row-parallel
  using bias_type = zest::parameter<P, "m">;                                // replicated

  // One engine group: under ZeRO-3 its parameters arrive in one all-gather over dp.
  tp_mlp(zest::zero_engine<P>& engine, const std::string& name, std::size_t width,
         std::size_t hidden)
      : engine_(&engine),
        group_(engine.begin_group(name)),
        fc_(engine, name + ".fc", {width, hidden}, {hidden}, 0.3),
        proj_(engine, name + ".proj", {hidden, width}, {}, 0.15),
        bias_(engine, name + ".proj.bias", {width}, zest::init::constant{0.0}, /*decay=*/false) {
    engine.end_group();
  }

  // x "btm", whole on tp; the result has x's layout.
  template <zest::sharded_tensor X>
  auto operator()(ad::tape& t, const ad::variable<X>& x) const {
    auto in_scope = engine_->use(t, group_);  // the parameters are usable in this scope
    auto h = ad::gelu(fc_(x));                // split(h:tp): each rank its columns
    auto partial_sum = proj_(h);              // h contracted over tp: a pending sum
    using sum_t = typename decltype(partial_sum)::tensor_type;
    static_assert(sum_t::layout.is_partial(sum_t::mesh_type::template axis_index<"tp">()));
    auto y = ad::redistribute<layout_of<X>>(partial_sum);  // all-reduce over tp
    return ad::broadcast_add(y, bias_.value());
  }

  const fc_type& fc() const { return fc_; }
  const proj_type& proj() const { return proj_; }
  const bias_type& bias() const { return bias_; }

 private:
  zest::zero_engine<P>* engine_;
  std::size_t group_;
  fc_type fc_;
  proj_type proj_;
  bias_type bias_;
};

// What train_step needs of a model: loss(tape, inputs, targets, seed), a scalar.
template <zest::training_policy_type P>
struct regression {
  tp_mlp<P> mlp;
  regression(zest::zero_engine<P>& engine, std::size_t width, std::size_t hidden)
      : mlp(engine, "mlp", width, hidden) {}

  template <zest::sharded_tensor X>
  auto loss(ad::tape& t, const X& inputs, const X& targets, std::uint64_t) const {
    auto d = mlp(t, t.constant(inputs)) - t.constant(targets);
    return ad::scale(ad::sum(d * d), 1.0F / static_cast<float>(inputs.size()));  // mean square
  }
};

// ---- Data, checks, flags -----------------------------------------------------------------
struct sizes {
  std::size_t batch = 8, time = 4, width = 16, hidden = 64;
};

// Step k's batch: x ~ N(0, 1) and a fixed nonlinear target, functions of the global index
// (so every mesh sees the same numbers); split over dp by batch.
template <class Mesh>
auto make_batch(const Mesh& mesh, const sizes& s, std::int64_t step) {
  using x_t = zest::tensor<float, Mesh, "btm", layout<split<'b', "dp">>>;
  const auto seed = static_cast<std::uint64_t>(step) + 100;
  auto x_at = [&](std::size_t b, std::size_t t, std::size_t m) {
    return zest::init::normal{1.0}(seed, (b * s.time + t) * s.width + m);
  };
  const typename x_t::extents_type e{s.batch, s.time, s.width};
  auto x = x_t::generate(mesh, e, [&](const auto& i) { return x_at(i[0], i[1], i[2]); });
  auto y = x_t::generate(mesh, e, [&](const auto& i) {
    return std::tanh(x_at(i[0], i[1], i[2])) + 0.5 * x_at(i[0], i[1], (i[2] + 1) % s.width);
  });
  return std::pair{std::move(x), std::move(y)};
}

int failures = 0;
bool root = false;

// Every rank calls check() alike; it passes when it passes on every rank.
void check(bool ok_here, const std::string& what) {
  int ok = ok_here ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (ok == 0) ++failures;
  if (root) std::cout << (ok != 0 ? "OK        " : "MISMATCH  ") << what << '\n';
}

template <class Param>
void describe(const Param& p, const std::string& name) {
  const auto& names = mesh_t::axis_names;
  const auto& l = Param::layouts;
  if (!root) return;
  const std::string dims = "\"" + std::string(zest::view_of<Param::dims>) + "\"";
  std::printf("  %-16s %-5s stored %-26s compute %-13s gradient %-24s %zu of %zu\n", name.c_str(),
              dims.c_str(), zest::to_string(l.stored, names).c_str(),
              zest::to_string(l.compute, names).c_str(), zest::to_string(l.gradient, names).c_str(),
              p.stored_elements(), p.size());
}

template <class Stage>
void run(int dp, int tp, std::int64_t steps) {
  using policy = zest::training_policy<mesh_t, Stage, float>;
  const sizes s;
  const mesh_t mesh(MPI_COMM_WORLD, {dp, tp});
  zest::zero_engine<policy> engine(mesh, {.seed = 7});
  const regression<policy> model(engine, s.width, s.hidden);
  const auto& mlp = model.mlp;
  if (root) std::cout << "mesh dp=" << dp << " x tp=" << tp << ", ZeRO-" << Stage::stage << "\n\n";

  // The layouts, and the collectives each step of the layer performs: from the types alone.
  if (root) std::cout << "parameters (elements stored on this rank of the whole):\n";
  describe(mlp.fc().weight(), "mlp.fc.weight");
  describe(mlp.fc().bias(), "mlp.fc.bias");
  describe(mlp.proj().weight(), "mlp.proj.weight");
  describe(mlp.bias(), "mlp.proj.bias");
  using fc_w = typename tp_mlp<policy>::fc_type::weight_type;
  using proj_w = typename tp_mlp<policy>::proj_type::weight_type;
  using bias_p = typename tp_mlp<policy>::bias_type;
  using x_t = zest::tensor<float, mesh_t, "btm", layout<split<'b', "dp">>>;
  const x_t x(mesh, {s.batch, s.time, s.width});  // stand-ins of the right types (zeros)
  const typename fc_w::compute_tensor w1(mesh, {s.width, s.hidden});
  const typename proj_w::compute_tensor w2(mesh, {s.hidden, s.width});
  const auto h = zest::einsum<"btm,mh->bth">(x, w1);
  const auto partial_sum = zest::einsum<"bth,hm->btm">(h, w2);
  const typename bias_p::gradient_tensor bias_grad(mesh, {s.width});
  const auto reduce_plan = zest::explain<layout_of<x_t>>(partial_sum);
  const auto bias_plan =
      zest::explain<layout_of<typename bias_p::reduced_gradient_tensor>>(bias_grad);
  if (root) {
    std::cout << "\nactivations x " << zest::layout_string<x_t>() << ", hidden "
              << zest::layout_string<decltype(h)>() << "\n\n"
              << zest::explain<"btm,mh->bth">(x, w1) << '\n'
              << zest::explain<"bth,hm->btm">(h, w2) << '\n'
              << reduce_plan << "\nthe output bias's gradient, before the dp reduction:\n"
              << bias_plan << '\n';
  }

  // 1. Train on this mesh, and the same model on one process (a mesh of sizes 1 x 1).
  std::vector<double> losses, ref_losses;
  std::vector<std::uint64_t> dp_bytes, tp_bytes;
  for (std::int64_t k = 0; k < steps; ++k) {
    const auto [in, tg] = make_batch(mesh, s, k);
    const auto dp_before = mesh.axis(0).stats(), tp_before = mesh.axis(1).stats();
    losses.push_back(zest::train_step(engine, model, in, tg, 1e-2).loss);
    dp_bytes.push_back((mesh.axis(0).stats() - dp_before).bytes_sent());
    tp_bytes.push_back((mesh.axis(1).stats() - tp_before).bytes_sent());
  }
  {
    using one_policy = zest::training_policy<zest::local_mesh<"dp", "tp">, Stage, float>;
    const zest::local_mesh<"dp", "tp"> one;
    zest::zero_engine<one_policy> one_engine(one, {.seed = 7});
    const regression<one_policy> one_model(one_engine, s.width, s.hidden);
    for (std::int64_t k = 0; k < steps; ++k) {
      const auto [in, tg] = make_batch(one, s, k);
      ref_losses.push_back(zest::train_step(one_engine, one_model, in, tg, 1e-2).loss);
    }
  }
  for (std::int64_t k = 0; k < steps; ++k) {
    const auto i = static_cast<std::size_t>(k);
    char line[128];
    std::snprintf(line, sizeof line, "step %2lld  loss %.6f  one process %.6f",
                  static_cast<long long>(k), losses[i], ref_losses[i]);
    check(std::abs(losses[i] - ref_losses[i]) <= 1e-5 * std::abs(ref_losses[i]), line);
  }
  check(losses.back() < losses.front(), "the loss decreases");

  // 2. Bytes per step. tp: the reduction forward and backward, and the bias's gradient.
  const std::uint64_t tp_expected = 2 * reduce_plan.bytes() + bias_plan.bytes();
  const auto every_step = [](const auto& v, std::uint64_t want) {
    return std::all_of(v.begin(), v.end(), [&](std::uint64_t b) { return b == want; });
  };
  check(every_step(tp_bytes, tp_expected),
        "tp bytes per step " + std::to_string(tp_bytes[0]) +
            " = 2 x the all-reduce + the bias gradient's = " + std::to_string(tp_expected));
  // dp: ZeRO's 2 Psi (N-1)/N (3 under stage 3) of this rank's tp slice of the parameters.
  std::uint64_t psi = 0;
  for (const auto* p : engine.parameters()) psi += p->compute_elements();
  const auto n = static_cast<std::uint64_t>(dp);
  const std::uint64_t dp_expected = (Stage::stage == 3 ? 3 : 2) * psi * (n - 1) / n * sizeof(float);
  check(every_step(dp_bytes, dp_expected),
        "dp bytes per step " + std::to_string(dp_bytes[0]) + " = " +
            (Stage::stage == 3 ? "3" : "2") + " x " + std::to_string(psi) +
            " x (N-1)/N floats = " + std::to_string(dp_expected));

  // 3. What each rank stores of the tp-split parameters.
  const std::size_t parts = static_cast<std::size_t>(tp) * (Stage::stage == 3 ? n : 1);
  auto share = [&](const auto& p) { return p.stored_elements() * parts == p.size(); };
  check(share(mlp.fc().weight()) && share(mlp.fc().bias()) && share(mlp.proj().weight()),
        "each rank stores 1/" + std::to_string(parts) + " of W1, b1 and W2");
}

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  root = rank == 0;
  int zero = 3, tp = world % 2 == 0 ? 2 : 1;
  std::int64_t steps = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--zero") zero = std::stoi(argv[i + 1]);
    if (flag == "--tp") tp = std::stoi(argv[i + 1]);
    if (flag == "--steps") steps = std::stoll(argv[i + 1]);
  }
  if (tp < 1 || world % tp != 0 || steps < 1) {
    if (root)
      std::cerr << "usage: custom_layer [--zero 0-3] [--tp N dividing the ranks] [--steps N]\n";
    return 2;
  }
  try {
    zest::with_zero_stage(zero, [&](auto stage) { run<decltype(stage)>(world / tp, tp, steps); });
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << '\n';
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (root) std::cout << (failures == 0 ? "all checks passed\n" : "some checks failed\n");
  return failures == 0 ? 0 : 1;
}
