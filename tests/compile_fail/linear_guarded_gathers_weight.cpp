// expect: zest einsum: this einsum needs a collective before its contraction, but the policy
// A column-parallel projection guarded with no_communication<> is fed a sequence-parallel
// stream (x "btm" split(t:tp)): the product would all-gather the weight over tp (its h split
// against x's t split), which the guard forbids. The fix, whole_on_tp<P>(x) first, is the
// twin case linear_guarded_whole_on_tp.cpp.
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
  auto y = fc(x);
  (void)y;
}
