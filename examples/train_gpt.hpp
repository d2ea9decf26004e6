// train_gpt.hpp — the training run of examples/train_gpt, for any mesh type: flags, the
// loop, logs and the sample. train_gpt.cpp runs it on a zest::mesh (CPU) and, with
// --device cuda, through train_gpt_cuda.cu on a zest::cuda_mesh; the code is the same.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zest/comm/mpi_environment.hpp"
#include "zest/core/json.hpp"
#include "zest/core/memory.hpp"
#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/optim/schedule.hpp"
#include "zest/report/progress.hpp"
#include "zest/report/training_log.hpp"
#include "zest/train/checkpoint.hpp"
#include "zest/train/train_step.hpp"
#include "zest/zero/planner.hpp"

namespace train_gpt_example {

// Data-parallel ranks "dp" times expert-parallel ranks "ep" (--ep, 1 unless --moe), on a
// zest::mesh (--device cpu) or a zest::cuda_mesh (--device cuda): train<P> takes the mesh
// type from the policy, and nothing else in it knows where the tensors live.
using token_layout = zest::layout<zest::split<'b', "dp", "ep">>;

struct flags {
  int zero = 3;
  std::int64_t steps = 300;
  std::uint64_t seed = 1234;
  std::size_t batch = 16;  // global, split over the ranks
  std::size_t context = 64;
  std::size_t width = 128;
  std::size_t layers = 4;
  std::size_t heads = 4;
  double lr = 3e-3;
  double min_lr = 3e-4;
  std::int64_t warmup = 20;
  double dropout = 0;
  double clip = 1.0;
  std::string precision = "fp32";
  std::string device = "cpu";
  std::string corpus;
  std::string log, plot, save, load;
  std::int64_t sample = 300;
  std::int64_t print_every = 10;
  bool quiet = false;
  // Mixture of experts.
  bool moe = false;
  std::size_t experts = 4;
  int top_k = 2;
  double capacity_factor = 1.25;
  double aux_weight = 0.01;
  int ep = 0;  // 0: as many as the experts and ranks allow
};

inline constexpr std::string_view usage =
    "usage: train_gpt [options]   (under mpiexec -n N for N data-parallel ranks)\n"
    "\n"
    "Trains a byte-level GPT on /usr/share/common-licenses (or --corpus) with ZeRO.\n"
    "\n"
    "  --zero N          ZeRO stage 0 (DDP), 1, 2 or 3 (default 3)\n"
    "  --steps N         train until step N, counted from the start of training (300)\n"
    "  --seed N          initialisation, batches and dropout (1234)\n"
    "  --batch N         global batch in sequences, split over the ranks (16)\n"
    "  --context N       sequence length (64)\n"
    "  --width N         model width (128)\n"
    "  --layers N        transformer blocks (4)\n"
    "  --heads N         attention heads (4)\n"
    "  --lr X            peak learning rate (3e-3), warmup + cosine to --min-lr (3e-4)\n"
    "  --warmup N        warmup steps (20)\n"
    "  --dropout X       dropout probability (0)\n"
    "  --clip X          global gradient-norm clipping, 0 for none (1.0)\n"
    "  --precision P     fp32, bf16 (bfloat16 parameters and gradients, fp32 master and\n"
    "                    Adam) or fp16 (float16, dynamic loss scaling) (fp32)\n"
    "  --device D        cpu, or cuda: one GPU per rank, NCCL (builds with CUDA)\n"
    "  --corpus PATH     a text file or a folder of text files\n"
    "  --log FILE        the run as JSON: run settings and steps [{step, loss, ...}]\n"
    "  --plot FILE       the loss curve as SVG\n"
    "  --save DIR        a sharded checkpoint at the end\n"
    "  --load DIR        resume from a checkpoint (any number of ranks, any stage)\n"
    "  --sample N        characters of generated text at the end (300; 0 for none)\n"
    "  --print-every N   progress lines when not on a terminal (10)\n"
    "  --moe             every other block's MLP becomes a GShard mixture of experts\n"
    "  --experts N       experts per MoE layer (4)\n"
    "  --top-k K         2 (GShard) or 1 (Switch) (2)\n"
    "  --capacity-factor F  expert capacity factor (1.25)\n"
    "  --aux-weight W    weight of the load-balancing loss (0.01)\n"
    "  --ep N            ranks of the expert axis; the data axis takes the rest\n"
    "                    (default: the largest divisor of both the ranks and the experts)\n"
    "  --quiet           no progress output\n"
    "  --help            this text\n";

template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    throw std::invalid_argument("train_gpt: " + std::string(flag) + " takes a number, not '" +
                                std::string(text) + "'");
  }
  return value;
}

inline std::optional<flags> parse(int argc, char** argv) {
  flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") return std::nullopt;
    if (a == "--quiet") {
      f.quiet = true;
      continue;
    }
    if (a == "--moe") {
      f.moe = true;
      continue;
    }
    if (i + 1 >= argc)
      throw std::invalid_argument("train_gpt: " + std::string(a) + " needs a value");
    const std::string_view v = argv[++i];
    if (a == "--zero") f.zero = parse_number<int>(a, v);
    else if (a == "--steps") f.steps = parse_number<std::int64_t>(a, v);
    else if (a == "--seed") f.seed = parse_number<std::uint64_t>(a, v);
    else if (a == "--batch") f.batch = parse_number<std::size_t>(a, v);
    else if (a == "--context") f.context = parse_number<std::size_t>(a, v);
    else if (a == "--width") f.width = parse_number<std::size_t>(a, v);
    else if (a == "--layers") f.layers = parse_number<std::size_t>(a, v);
    else if (a == "--heads") f.heads = parse_number<std::size_t>(a, v);
    else if (a == "--lr") f.lr = parse_number<double>(a, v);
    else if (a == "--min-lr") f.min_lr = parse_number<double>(a, v);
    else if (a == "--warmup") f.warmup = parse_number<std::int64_t>(a, v);
    else if (a == "--dropout") f.dropout = parse_number<double>(a, v);
    else if (a == "--clip") f.clip = parse_number<double>(a, v);
    else if (a == "--precision") f.precision = v;
    else if (a == "--device") f.device = v;
    else if (a == "--corpus") f.corpus = v;
    else if (a == "--log") f.log = v;
    else if (a == "--plot") f.plot = v;
    else if (a == "--save") f.save = v;
    else if (a == "--load") f.load = v;
    else if (a == "--sample") f.sample = parse_number<std::int64_t>(a, v);
    else if (a == "--print-every") f.print_every = parse_number<std::int64_t>(a, v);
    else if (a == "--experts") f.experts = parse_number<std::size_t>(a, v);
    else if (a == "--top-k") f.top_k = parse_number<int>(a, v);
    else if (a == "--capacity-factor") f.capacity_factor = parse_number<double>(a, v);
    else if (a == "--aux-weight") f.aux_weight = parse_number<double>(a, v);
    else if (a == "--ep") f.ep = parse_number<int>(a, v);
    else
      throw std::invalid_argument("train_gpt: unknown option " + std::string(a) + " (see --help)");
  }
  if (f.zero < 0 || f.zero > 3) throw std::invalid_argument("train_gpt: --zero takes 0, 1, 2 or 3");
  if (f.precision != "fp32" && f.precision != "bf16" && f.precision != "fp16") {
    throw std::invalid_argument("train_gpt: --precision takes fp32, bf16 or fp16");
  }
  if (f.device != "cpu" && f.device != "cuda") {
    throw std::invalid_argument("train_gpt: --device takes cpu or cuda");
  }
  if (f.device == "cuda" && f.precision == "fp16") {
    throw std::invalid_argument(
        "train_gpt: --device cuda trains in fp32 or bf16 (--precision fp16 runs on the CPU)");
  }
  if (f.top_k != 1 && f.top_k != 2) throw std::invalid_argument("train_gpt: --top-k takes 1 or 2");
  if (f.ep < 0) throw std::invalid_argument("train_gpt: --ep takes a positive number");
  if (f.steps < 0 || f.batch == 0 || f.context == 0 || f.width == 0 || f.layers == 0) {
    throw std::invalid_argument(
        "train_gpt: --steps, --batch, --context, --width and --layers must be positive");
  }
  return f;
}

inline zest::json::value config_json(const flags& f, std::size_t vocab) {
  zest::json::object c;
  c.emplace_back("vocab", static_cast<std::int64_t>(vocab));
  c.emplace_back("context", static_cast<std::int64_t>(f.context));
  c.emplace_back("width", static_cast<std::int64_t>(f.width));
  c.emplace_back("layers", static_cast<std::int64_t>(f.layers));
  c.emplace_back("heads", static_cast<std::int64_t>(f.heads));
  c.emplace_back("batch", static_cast<std::int64_t>(f.batch));
  c.emplace_back("seed", static_cast<std::int64_t>(f.seed));
  if (f.moe) {
    c.emplace_back("experts", static_cast<std::int64_t>(f.experts));
    c.emplace_back("top_k", static_cast<std::int64_t>(f.top_k));
  }
  return c;
}

// The model's vocabulary: the corpus's, rounded up to a multiple of 32 so that the tables
// split evenly over 1, 2, 4, ... ranks (the extra rows are never a target).
inline std::size_t padded_vocab(std::size_t v) { return (v + 31) / 32 * 32; }

// What the expert layers did in a step (gpt<P>::moe_report, whose type is the policy's).
struct moe_figures {
  double nll = 0, aux_loss = 0, dropped_fraction = 0;
  std::vector<std::int64_t> tokens_per_expert;
};

// The parts of a run that do not depend on the training policy: train<P> is compiled once
// per policy (twelve times on the CPU), these once, in train_gpt.cpp (bench/README.md,
// "Compile time and memory").

// The first lines: the model, the run and the model states per rank.
void print_header(const flags& f, const zest::text_dataset& data, std::size_t vocab,
                  std::size_t params, const std::string& mesh, std::size_t moe_layers,
                  std::int64_t model_state_bytes, double planner_bytes, double entropy);

// The run's settings in the log (a resumed run appends to the log it continues).
zest::report::training_log start_log(const flags& f, std::size_t vocab, const std::string& mesh,
                                     std::size_t params, double entropy,
                                     std::int64_t model_state_bytes);

// A step's entry in the log.
zest::json::value step_record(std::int64_t step, const zest::train_step_result& r,
                              double tokens_per_step, bool loss_scaling, const moe_figures* moe);

// A step's progress line.
std::string progress_text(const zest::train_step_result& r, double tokens_per_step,
                          std::int64_t model_state_bytes, const moe_figures* moe);

// The sample's next character: temperature 0.8 over the real vocabulary, from the logits of
// the last position (`at` in the global logits); every rank draws the same character.
std::int32_t draw_next(const std::vector<float>& all, std::size_t at, std::size_t vocab,
                       std::mt19937_64& rng);

// Rank 0 at the end: the summary line and sample, the log's summary, the log and the plot.
void finish_run(const flags& f, zest::report::training_log& log, const std::string& mesh,
                double last_loss, double entropy, std::int64_t trained, double seconds,
                double tokens_per_step, const std::string& sample);

template <class P>
int train(const flags& f, const typename P::mesh_type& mesh, const zest::text_dataset& data) {
  using mesh_t = typename P::mesh_type;
  // Model states live where the mesh's backend keeps its buffers (host or device memory).
  auto& memory = zest::backend_of<mesh_t>::counters();
  const bool root = mesh.rank() == 0;
  zest::zero_options zo;
  zo.seed = f.seed;
  zo.max_grad_norm = f.clip;
  zest::zero_engine<P> engine(mesh, zo);

  zest::gpt_options go;
  go.vocab = padded_vocab(data.vocab_size());
  go.context = f.context;
  go.width = f.width;
  go.layers = f.layers;
  go.heads = f.heads;
  go.dropout = f.dropout;
  go.moe = f.moe;
  go.experts = f.experts;
  go.gating.top_k = f.top_k;
  go.gating.capacity_factor = f.capacity_factor;
  go.aux_weight = f.aux_weight;
  const std::int64_t before_model = memory.live.load();
  zest::gpt<P> model(engine, go);
  const std::int64_t model_state_bytes = memory.live.load() - before_model;
  const auto params = engine.parameter_count();

  std::int64_t step = 0;
  if (!f.load.empty()) {
    const auto info = zest::load_training_state(
        f.load, engine, {.corpus = data.identity(), .allow_other_corpus = false});
    if (info.metadata["config"] != config_json(f, data.vocab_size())) {
      // Same tensors (else load_training_state refused) but another batch or seed.
      if (root)
        std::cout << "note: the checkpoint was trained with other settings: "
                  << zest::json::dump(info.metadata["config"]) << '\n';
    }
    step = info.step;
  }

  const zest::warmup_cosine schedule{f.lr, f.min_lr, std::min(f.warmup, f.steps),
                                     std::max<std::int64_t>(f.steps, 1)};
  zest::batch_sampler sampler(data.train(), f.batch, f.context, f.seed);
  const double entropy = data.unigram_entropy().nats;

  const auto plan = zest::plan_zero<typename P::stage>(
      model.shape(), mesh,
      std::is_same_v<typename P::param_type, float> ? zest::fp32_adam : zest::mixed_precision_adam);
  const std::string described = mesh.describe();
  if (root && !f.quiet) {
    print_header(f, data, go.vocab, params, described, model.moe_layer_count(), model_state_bytes,
                 static_cast<double>(plan.memory.total()), entropy);
  }

  zest::report::training_log log =
      start_log(f, data.vocab_size(), described, params, entropy, model_state_bytes);

  zest::report::progress_line progress(f.steps, (root && !f.quiet) ? stdout : nullptr);
  const double tokens_per_step = static_cast<double>(f.batch * f.context);
  double last_loss = std::nan("");
  double seconds = 0;
  std::int64_t trained = 0;
  for (; step < f.steps; ++step) {
    const auto [inputs, targets] =
        sampler.template batch<token_layout>(mesh, static_cast<std::size_t>(step));
    const auto r = zest::train_step(engine, model, inputs, targets, schedule(step),
                                    zest::splitmix64(f.seed ^ static_cast<std::uint64_t>(step)));
    last_loss = r.loss;
    seconds += r.seconds;
    ++trained;
    moe_figures moe;
    if (f.moe) {
      auto m = model.last_moe_report();
      moe = {m.nll, m.aux_loss, m.dropped_fraction, std::move(m.tokens_per_expert)};
    }
    const moe_figures* moe_if = f.moe ? &moe : nullptr;
    log.add_step(step_record(step, r, tokens_per_step, P::loss_scaling, moe_if));
    if (root && !f.quiet &&
        (progress.on_terminal() || (step + 1) % f.print_every == 0 || step + 1 == f.steps ||
         step == 0)) {
      progress.update(step + 1, progress_text(r, tokens_per_step, model_state_bytes, moe_if));
    }
  }
  progress.finish();

  if (!f.save.empty()) {
    zest::save_training_state(f.save, engine, step, config_json(f, data.vocab_size()),
                              data.identity());
    if (root && !f.quiet) std::cout << "saved " << f.save << " at step " << step << '\n';
  }

  // A sample: the model continues a prompt, one character at a time.
  std::string sample;
  if (f.sample > 0) {
    const std::string prompt = "Permission is ";
    std::vector<std::int32_t> ids = data.encode(prompt);
    std::mt19937_64 rng(f.seed);
    const std::size_t rows = static_cast<std::size_t>(mesh.world_size());  // one row per rank
    for (std::int64_t k = 0; k < f.sample; ++k) {
      const std::size_t len = std::min(ids.size(), f.context);
      const std::span<const std::int32_t> window(ids.data() + ids.size() - len, len);
      using ids_t = zest::tensor<std::int32_t, mesh_t, "bt", token_layout>;
      const auto in =
          ids_t::generate(mesh, {rows, len}, [&](const auto& i) { return window[i[1]]; });
      zest::autodiff::tape t;
      const auto logits = model.logits(t, in);
      engine.discard_forward();
      const auto all = zest::to_global(logits.value());  // [rows, len, vocab] on every rank
      ids.push_back(draw_next(all, (len - 1) * go.vocab, data.vocab_size(), rng));
    }
    sample = data.decode(ids);
  }

  if (root) {
    finish_run(f, log, described, last_loss, entropy, trained, seconds, tokens_per_step, sample);
  }
  return 0;
}

template <class Mesh, class Param>
int train_with_precision(const flags& f, const Mesh& mesh, const zest::text_dataset& data) {
  return zest::with_zero_stage(f.zero, [&](auto stage) {
    return train<zest::training_policy<Mesh, decltype(stage), Param>>(f, mesh, data);
  });
}

// The mesh over all ranks ("dp" x "ep" = sizes) and the run in the precision asked for.
template <class Mesh, class... Precisions>
int train_on(const flags& f, const zest::text_dataset& data, std::array<int, 2> sizes) {
  const Mesh mesh(MPI_COMM_WORLD, sizes);
  if (f.precision == "bf16") return train_with_precision<Mesh, zest::bfloat16>(f, mesh, data);
  if constexpr ((std::is_same_v<Precisions, zest::float16> || ...)) {
    if (f.precision == "fp16") return train_with_precision<Mesh, zest::float16>(f, mesh, data);
  }
  return train_with_precision<Mesh, float>(f, mesh, data);
}

// --device cpu: the mesh of train_gpt.cpp's runs. Their three precisions are compiled apart,
// in train_gpt_fp32.cpp, train_gpt_bf16.cpp and train_gpt_fp16.cpp (explicit instantiations
// of train_with_precision<cpu_mesh, ...>, declared extern in train_gpt.cpp).
using cpu_mesh = zest::mesh<"dp", "ep">;

// --device cuda: defined in train_gpt_cuda.cu, compiled by nvcc when the build has CUDA.
int train_on_cuda(const flags& f, const zest::text_dataset& data, std::array<int, 2> sizes);

}  // namespace train_gpt_example
