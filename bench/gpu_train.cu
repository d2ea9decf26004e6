// bench/gpu_train.cu — training throughput of zest's GPT on one GPU: the same model, engine
// and optimizer as examples/train_gpt, on a one-GPU cuda_mesh.
//
//   bench_gpu_train [--layers 8] [--width 1024] [--heads 16] [--context 512] [--batch 32]
//                   [--steps 12] [--zero 1] [--peak-tflops 989] [--json FILE] [--quick]
//
// bf16 parameters and gradients with fp32 masters (ZeRO-1 on one rank: the optimizer step on
// the whole model), tokens drawn uniformly from 256 byte values. Prints `METRIC <name>
// <value>` lines (bench/run's protocol) and, with --json, writes {"metrics": {...}}:
//   gpu_train_tokens_per_s   batch x context / the median step time of the steps after
//                            the first three (allocation, cuBLAS heuristics)
//   gpu_train_mfu            model FLOPs utilisation: tokens/s x FLOPs per token / the peak,
//                            FLOPs per token = 6 N + 12 L d T (N the parameters but the token
//                            and position tables, L layers, d width, T context: the forward's
//                            2 N + 4 L d T, the backward twice that), the peak --peak-tflops
//                            (default 989: dense bf16 of an H100 or H200 SXM, the datasheet's)
// bench/peers/torch_gpt_gpu.py trains the same model in PyTorch and counts the same way.
// A step's time runs from the forward to the end of the optimizer step; reading the loss and
// the gradient norm waits for the device, so a step's kernels are inside it.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "zest/cuda.hpp"

namespace {

using mesh_t = zest::cuda_mesh<"dp">;
using tokens = zest::layout<zest::split<'b', "dp">>;

template <int Stage>
int run(const zest::gpt_options& o, std::size_t batch, int steps, double peak_tflops,
        const std::string& json) {
  using policy = zest::training_policy<mesh_t, zest::zero_stage<Stage>, zest::bfloat16>;
  const mesh_t m(MPI_COMM_WORLD, {1});
  zest::zero_engine<policy> engine(m, {.seed = 1});
  zest::gpt<policy> model(engine, o);

  std::vector<std::int32_t> text(1U << 20U);
  for (std::size_t i = 0; i < text.size(); ++i)
    text[i] = static_cast<std::int32_t>(zest::splitmix64(i) % o.vocab);
  const zest::batch_sampler sampler(text, batch, o.context, 3);

  std::vector<double> seconds;
  double loss = 0;
  for (int s = 0; s < steps; ++s) {
    const auto [in, tg] = sampler.batch<tokens>(m, static_cast<std::size_t>(s));
    const auto r = zest::train_step(engine, model, in, tg, 1e-4);
    seconds.push_back(r.seconds);
    loss = r.loss;
    std::printf("step %d: loss %.4f, %.3f s, peak device memory %.2f GiB\n", s + 1, r.loss,
                r.seconds, static_cast<double>(r.peak_bytes) / (1U << 30U));
  }
  std::vector<double> timed(seconds.begin() + std::min<std::ptrdiff_t>(3, steps - 1),
                            seconds.end());
  std::sort(timed.begin(), timed.end());
  const double median = timed[timed.size() / 2];
  const double rate = static_cast<double>(batch * o.context) / median;
  const double tables = static_cast<double>((o.vocab + o.context) * o.width);
  const double flops_per_token = 6.0 * (static_cast<double>(engine.parameter_count()) - tables) +
                                 12.0 * static_cast<double>(o.layers * o.width * o.context);
  const double mfu = rate * flops_per_token / (peak_tflops * 1e12);
  std::printf(
      "gpt: %zu parameters, %zu layers, width %zu, batch %zu x %zu, ZeRO-%d bf16: "
      "%.0f tokens/s (median step %.3f s), final loss %.4f\n",
      engine.parameter_count(), o.layers, o.width, batch, o.context, Stage, rate, median, loss);
  std::printf("model FLOPs per token %.4g: %.1f TFLOP/s, MFU %.4f of %.0f TFLOP/s\n",
              flops_per_token, rate * flops_per_token / 1e12, mfu, peak_tflops);
  std::printf("METRIC gpu_train_tokens_per_s %.1f\n", rate);
  std::printf("METRIC gpu_train_mfu %.4f\n", mfu);
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"metrics\": {\"gpu_train_tokens_per_s\": " << rate << ", \"gpu_train_mfu\": " << mfu
        << ", \"gpu_train_median_step_s\": " << median << "}}\n";
    if (!out) {
      std::fprintf(stderr, "bench_gpu_train: cannot write %s\n", json.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zest::mpi_environment mpi(&argc, &argv);
  zest::gpt_options o;
  o.vocab = 256;
  o.layers = 8;
  o.width = 1024;
  o.heads = 16;
  o.context = 512;
  std::size_t batch = 32;
  int steps = 12, zero = 1;
  double peak_tflops = 989;
  std::string json;
  int at = 0;  // the option being read, for the message of a value that is no number
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      at = i;
      const auto next = [&]() -> std::string {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "bench_gpu_train: %s needs a value\n", argv[i]);
          std::exit(2);
        }
        return argv[++i];
      };
      if (arg == "--layers") o.layers = std::stoul(next());
      else if (arg == "--width") o.width = std::stoul(next());
      else if (arg == "--heads") o.heads = std::stoul(next());
      else if (arg == "--context") o.context = std::stoul(next());
      else if (arg == "--batch") batch = std::stoul(next());
      else if (arg == "--steps") steps = std::max(1, std::stoi(next()));
      else if (arg == "--zero") zero = std::stoi(next());
      else if (arg == "--peak-tflops") peak_tflops = std::stod(next());
      else if (arg == "--json") json = next();
      else if (arg == "--quick") o.layers = 4, o.width = 512, o.heads = 8, steps = 6;
      else {
        std::fprintf(stderr,
                     "usage: bench_gpu_train [--layers N] [--width N] [--heads N] [--context N] "
                     "[--batch N] [--steps N] [--zero 1|3] [--peak-tflops X] [--json FILE] "
                     "[--quick]\n");
        return 2;
      }
    }
  } catch (const std::logic_error&) {  // std::stoul, stoi, stod: not a number, or out of range
    std::fprintf(stderr, "bench_gpu_train: %s takes a number, not '%s'\n", argv[at],
                 at + 1 < argc ? argv[at + 1] : "");
    return 2;
  }
  if (zero != 1 && zero != 3) {
    std::fprintf(stderr, "bench_gpu_train: --zero takes 1 or 3\n");
    return 2;
  }
  if (!(peak_tflops > 0) || o.layers == 0 || o.width == 0 || o.heads == 0 || o.context == 0 ||
      batch == 0) {
    std::fprintf(stderr,
                 "bench_gpu_train: --peak-tflops, --layers, --width, --heads, --context and "
                 "--batch take positive numbers\n");
    return 2;
  }
  // No driver or no device: 77; a CUDA that fails to start otherwise throws.
  if (const auto seen = zest::cuda::visible_devices(); seen.count == 0) {
    std::fprintf(stderr, "bench_gpu_train: no usable GPU: %s\n", seen.why_none.c_str());
    return 77;
  }
  try {  // a model the options cannot make (width not a multiple of heads, ...), out of memory
    if (zero == 3) return run<3>(o, batch, steps, peak_tflops, json);
    return run<1>(o, batch, steps, peak_tflops, json);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_train: %s\n", e.what());
    return 1;
  }
}
