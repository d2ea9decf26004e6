// expect-compiles
// The twin of linear_guarded_gathers_weight.cpp: the sequence-parallel stream is brought
// whole on tp first (whole_on_tp: an all-gather of the activations, once), and the guarded
// column-parallel product is then local.
#include <zest/zest.hpp>

using mesh_t = zest::local_mesh<"dp", "tp">;
using policy = zest::training_policy<mesh_t, zest::zero_stage<0>>;
using on_tp = zest::layout<zest::split<'h', "tp">>;

int main() {
  mesh_t m;
  zest::zero_engine<policy> engine(m);
  const std::size_t group = engine.begin_group("fc");  // the weight and bias together
  const zest::linear<policy, "btm,mh->bth", "mh", "h", on_tp, on_tp, zest::no_communication<>> fc(
      engine, "fc", {4, 8}, {8});
  engine.end_group();
  zest::autodiff::tape t;
  const auto in_scope = engine.use(t, group);
  using stream_t = zest::tensor<float, mesh_t, "btm", zest::layout<zest::split<'t', "tp">>>;
  const auto x = t.constant(stream_t(m, {2, 6, 4}));
  auto y = fc(zest::whole_on_tp<policy>(x));
  (void)y;
}
