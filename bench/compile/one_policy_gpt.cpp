// one_policy_gpt — a GPT trained under one training policy (ZeRO-3, fp32, mesh<"dp">): the
// smallest training program. Not run by anything; bench/run compiles it alone to measure
// what one policy of zest's training stack costs the compiler
// (METRIC compile_cpu_s_one_policy_gpt, compile_peak_mib_one_policy_gpt).
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "zest/zest.hpp"

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  using mesh_t = zest::mesh<"dp">;
  using policy = zest::training_policy<mesh_t, zest::zero_stage<3>, float>;
  const mesh_t mesh(MPI_COMM_WORLD, {-1});
  zest::zero_engine<policy> engine(mesh, zest::zero_options{.seed = 1});
  zest::gpt_options o;
  o.vocab = 64;
  o.context = 16;
  o.width = 32;
  o.layers = 2;
  o.heads = 2;
  zest::gpt<policy> model(engine, o);
  std::string text;
  for (int i = 0; i < 64; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  const auto data = zest::text_dataset::from_text(text);
  const zest::batch_sampler sampler(data.train(), 4, o.context, 1);
  for (std::size_t step = 0; step < 3; ++step) {
    const auto [inputs, targets] = sampler.batch<"dp">(mesh, step);
    const auto r = zest::train_step(engine, model, inputs, targets, 1e-3,
                                    zest::splitmix64(static_cast<std::uint64_t>(step)));
    if (mesh.rank() == 0) std::printf("step %zu: loss %.4f\n", step, r.loss);
  }
  return 0;
}
