// train_gpt.hpp — the training run of examples/train_gpt, for any mesh type and model: flags,
// the loop, logs and the sample. train_gpt.cpp runs it on a zest::mesh (CPU) and, with
// --device cuda, through train_gpt_cuda.cu on a zest::cuda_mesh; the code is the same. The
// model is zest::gpt (--arch gpt) or examples/llama.hpp's decoder (--arch llama, through
// train_gpt_llama.hpp).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zest/comm/checked.hpp"
#include "zest/comm/mpi_environment.hpp"
#include "zest/core/json.hpp"
#include "zest/core/memory.hpp"
#include "zest/data/batches.hpp"
#include "zest/data/text_dataset.hpp"
#include "zest/io/checkpoint.hpp"
#include "zest/mesh/mesh.hpp"
#include "zest/nn/gpt.hpp"
#include "zest/nn/gpt_weights.hpp"
#include "zest/optim/schedule.hpp"
#include "zest/report/progress.hpp"
#include "zest/report/training_log.hpp"
#include "zest/train/checkpoint.hpp"
#include "zest/train/train_step.hpp"
#include "zest/train/weights.hpp"
#include "zest/zero/planner.hpp"
#include "zest/zero/recomputation.hpp"
#include "zest/zero/step_inventory.hpp"

namespace train_gpt_example {

// Nodes "node" (--hsdp or --nodes, 1 unless asked) times data-parallel ranks "dp" times
// expert-parallel ranks "ep" (--ep, 1 unless --moe) times tensor-parallel ranks "tp" (--tp)
// times Ulysses' sequence-parallel ranks "sp" (--sp), on a zest::mesh (--device cpu) or a
// zest::cuda_mesh (--device cuda, "node" x "dp" x "ep" only): train<P> takes the mesh type
// from the policy, and nothing else in it knows where the tensors live. ZeRO partitions over
// dp and replicates over node (hybrid sharding: zero_stage<K, "dp">::replicated_over<
// "node">; with one node, plain ZeRO over dp). Under --zeropp it partitions over both
// (ZeRO++: zeropp_stage below).
// The batch is split over node, dp and ep; where the mesh has "sp" and "tp", the sequence is split
// over them (tp nested inside sp), so the models run Ulysses' attention over sp and
// Megatron's sequence parallelism between their tensor-parallel regions over tp
// (zest/nn/tensor_parallel.hpp); an axis of one rank moves nothing.
template <class P>
using token_layout = std::conditional_t<
    P::has_tensor_axis,
    zest::layout<zest::split<'b', "node", "dp", "ep">, zest::split<'t', "sp", "tp">>,
    zest::layout<zest::split<'b', "node", "dp", "ep">>>;

struct flags {
  int zero = 3;
  std::int64_t steps = 300;
  std::int64_t schedule_steps = 0;  // 0 on the command line: --steps (resolve_schedule)
  std::uint64_t seed = 1234;
  std::size_t batch = 16;  // global, split over the ranks
  std::size_t context = 64;
  std::size_t width = 128;
  std::size_t layers = 4;
  std::size_t heads = 4;
  double lr = 3e-3;
  double min_lr = 3e-4;
  std::int64_t warmup = 20;
  bool new_schedule = false;
  double dropout = 0;
  std::string recompute = "none";  // activation recomputation: none, selective or full
  double clip = 1.0;
  std::string precision = "fp32";
  float loss_scale = 65536.0F;  // fp16: the loss scaler's first scale
  std::string device = "cpu";
  std::string corpus;
  std::string log, plot, save, load;
  // Weights as a safetensors file (or a folder's model.safetensors and config.json):
  // written at the end, read before the first step.
  std::string export_to, init_from;
  std::int64_t save_every = 0;  // --save every N steps too (0: at the end only)
  bool async_save = false;      // --save's shards written beside the training
  bool new_data = false;        // --load: continue in another data stream (batch, seed)
  std::int64_t sample = 300;
  std::int64_t print_every = 10;
  bool quiet = false;
  bool checked = false;
  bool explain = false;  // print the step's collectives (zest::inventory_step) and stop
  // Mixture of experts.
  bool moe = false;
  std::size_t experts = 4;
  int top_k = 2;
  double capacity_factor = 1.25;
  double aux_weight = 0.01;
  bool moe_capacity = false;    // --moe-capacity: GShard's capacity routing (the default)
  bool moe_dropless = false;    // --moe-dropless: every expert computes exactly its tokens
  double bias_update_rate = 0;  // balancing without an aux loss: the routing bias's step
  int hsdp = 1;                 // replica groups of the ZeRO shards (hybrid sharding)
  std::string zeropp;           // --zeropp: "hpz,qwz,qgz" (ZeRO++), or empty
  int nodes = 1;                // --zeropp: the nodes the data-parallel ranks make
  int ep = 0;                   // 0: as many as the experts and ranks allow
  int tp = 1;
  int sp = 1;
  // The model: gpt (zest::gpt) or llama (examples/llama.hpp).
  std::string arch = "gpt";
  std::size_t kv_heads = 0;  // llama: 0 on the command line: --heads (resolve_arch)
  std::size_t hidden = 0;    // llama: 0 on the command line: llama_example::default_hidden
  bool tie_head = false;
  double rope_base = 10000.0;

  std::vector<std::string> given;  // the options on the command line
  bool was_given(std::string_view option) const {
    return std::find(given.begin(), given.end(), option) != given.end();
  }
};

// --help: every option with its range and default (train_gpt.cpp holds the table of
// options that both parse() and usage() read).
std::string usage();

// The options as given; std::nullopt for --help. Throws std::invalid_argument naming the
// option (or the word) at fault: unknown, given twice, without its value, out of its range.
// Checks that need the ranks, the corpus or the files are check_run's.
std::optional<flags> parse(int argc, char** argv);

// The learning-rate schedule of the run (after resolve_schedule).
inline zest::warmup_cosine schedule_of(const flags& f) {
  return {f.lr, f.min_lr, std::min(f.warmup, f.schedule_steps), f.schedule_steps};
}

inline zest::json::value schedule_json(const zest::warmup_cosine& s) {
  zest::json::object j;
  j.emplace_back("peak_lr", s.peak_lr);
  j.emplace_back("min_lr", s.min_lr);
  j.emplace_back("warmup_steps", s.warmup_steps);
  j.emplace_back("total_steps", s.total_steps);
  return j;
}

// The model and data settings a checkpoint is compared with on load (the schedule is kept
// beside them, in the checkpoint's metadata "schedule": resolve_schedule reads it).
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
    if (f.moe_dropless) c.emplace_back("dropless", true);
  }
  if (f.arch != "gpt") {
    c.emplace_back("arch", f.arch);
    c.emplace_back("kv_heads", static_cast<std::int64_t>(f.kv_heads));
    c.emplace_back("hidden", static_cast<std::int64_t>(f.hidden));
    c.emplace_back("tied_head", f.tie_head);
    c.emplace_back("rope_base", f.rope_base);
  }
  return c;
}

// The settings of config_json that differ between a checkpoint's (`saved`) and this run's
// (`now`), as options: "--batch 8 (this run: 16), --seed 1 (this run: 2)"; empty when none.
inline std::string settings_differing(const zest::json::value& saved,
                                      const zest::json::value& now) {
  if (!saved.is_object() || !now.is_object()) return saved == now ? "" : "(unreadable config)";
  const auto option = [](const std::string& key) {
    if (key == "vocab") return std::string("the corpus's vocabulary");
    if (key == "tied_head") return std::string("--tie-head");
    if (key == "dropless") return std::string("--moe-dropless");
    std::string o = "--" + key;
    std::replace(o.begin(), o.end(), '_', '-');
    return o;
  };
  const auto text = [](const zest::json::value* v) {
    return v == nullptr ? std::string("not set") : zest::json::dump(*v);
  };
  std::vector<std::string> keys;
  for (const auto* side : {&saved, &now}) {
    for (const auto& [key, value] : side->as_object()) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  std::string out;
  for (const std::string& key : keys) {
    const zest::json::value* a = saved.find(key);
    const zest::json::value* b = now.find(key);
    if (a != nullptr && b != nullptr && *a == *b) continue;
    out += (out.empty() ? "" : ", ") + option(key) + " " + text(a) + " (this run: " + text(b) + ")";
  }
  return out;
}

// The model's vocabulary: the corpus's, rounded up to a multiple of 32 so that the tables
// split evenly over 1, 2, 4, ... ranks (the extra rows are never a target).
inline std::size_t padded_vocab(std::size_t v) { return (v + 31) / 32 * 32; }

// What the expert layers did in a step (gpt<P>::moe_report, whose type is the policy's).
struct moe_figures {
  double nll = 0, aux_loss = 0, dropped_fraction = 0;
  std::vector<std::int64_t> tokens_per_expert;
  std::vector<std::int64_t> load_per_expert, dropped_per_expert;  // all k choices
};

// The expert layers' routing biases in a checkpoint's config ("routing_bias", one list per
// layer) and back; an empty list where a layer has none.
inline zest::json::value routing_bias_json(const std::vector<std::vector<double>>& biases) {
  zest::json::array layers;
  for (const auto& b : biases) {
    zest::json::array values;
    for (double v : b) values.emplace_back(v);
    layers.emplace_back(std::move(values));
  }
  return layers;
}
inline std::vector<std::vector<double>> routing_bias_of(const zest::json::value& j) {
  std::vector<std::vector<double>> out;
  for (const auto& layer : j.as_array()) {
    out.emplace_back();
    for (const auto& v : layer.as_array()) out.back().push_back(v.as_number());
  }
  return out;
}

// The parts of a run that do not depend on the training policy: train<P> is compiled once
// per policy (twelve times on the CPU), these once, in train_gpt.cpp (bench/README.md,
// "Compile time and memory").

// The first lines: the model, the run and the model states per rank.
void print_header(const flags& f, const zest::text_dataset& data, std::size_t vocab,
                  std::size_t params, const std::string& mesh, std::size_t moe_layers,
                  std::int64_t model_state_bytes, double planner_bytes, double entropy);

// The checks of a run before any work, once parse() has read the options and before the
// corpus is read or a mesh made: the options' agreement with each other and with the `world`
// ranks, the outputs writable, and the memory the run needs (check_memory) for the
// `ranks_here` ranks on this machine. Throws std::invalid_argument naming the options.
void check_run(const flags& f, int world, int ranks_here);

// The mesh's sizes {node, dp, ep, tp, sp} for `world` ranks (--hsdp, --ep or its default,
// --tp, --sp).
using mesh_sizes_t = std::array<int, 5>;
mesh_sizes_t mesh_sizes(const flags& f, int world);

// What a run needs per rank, estimated before anything is allocated: the model states by
// the ZeRO planner (zest::plan_zero, for the largest byte vocabulary), the activations of
// the tape (forward values and their gradients, fp32) and each parameter tensor's
// bookkeeping.
struct memory_need {
  double model_states = 0, activations = 0, bookkeeping = 0;
  double total() const { return model_states + activations + bookkeeping; }
};
memory_need estimate_memory(const flags& f, mesh_sizes_t sizes);
// Throws std::invalid_argument, with the figures and the options behind the largest, when
// `ranks_here` times the need exceeds the machine's memory (RAM, or the cgroup's limit).
void check_memory(const flags& f, mesh_sizes_t sizes, int ranks_here);

// --arch llama: sets --kv-heads (default --heads) and --hidden (default
// llama_example::default_hidden) where not given, so that the log and the checkpoint's config
// hold the model's figures.
void resolve_arch(flags& f);

// Sets the schedule's length (--schedule-steps, default --steps) and, when resuming, takes
// the checkpoint's schedule (`saved`: its metadata config's "schedule", or nullptr) for the
// options not given; a given one that differs is refused unless --new-schedule, which
// follows it and says so (on `root`).
void resolve_schedule(flags& f, const zest::json::value* saved, bool root);

// The run's settings in the log, with the memory estimated before the run
// ("memory_estimate_per_rank"). A resumed run (--load) appends to the log it continues,
// after dropping the steps that log has beyond the checkpoint's `step`.
zest::report::training_log start_log(const flags& f, std::size_t vocab, const std::string& mesh,
                                     std::size_t params, double entropy,
                                     std::int64_t model_state_bytes, const memory_need& estimate,
                                     std::int64_t step);

// The collective inventory of a step (zest/zero/step_inventory.hpp) for --arch gpt: the
// model and layout as the planner sees them, and the lines as the log keeps them.
zest::transformer_config inventory_model(const flags& f, std::size_t vocab);
zest::parallel_layout inventory_layout(const flags& f, mesh_sizes_t sizes);
zest::json::value inventory_json(const zest::step_inventory& inv);

// A step's entry in the log.
zest::json::value step_record(std::int64_t step, const zest::train_step_result& r,
                              std::span<const std::string_view> axes, double tokens_per_step,
                              bool loss_scaling, const moe_figures* moe);

// A step's progress line.
std::string progress_text(const zest::train_step_result& r, double tokens_per_step,
                          std::int64_t model_state_bytes, const moe_figures* moe);

// Whether a step's figures mean that training cannot go on, and why ("" when it can): a
// non-finite loss (the forward pass overflowed; no loss scale changes that), non-finite
// gradients applied to the parameters (without loss scaling), or gradients that overflow
// at the smallest loss scale (`min_loss_scale`, under loss scaling).
std::string divergence(std::int64_t step, const zest::train_step_result& r, bool loss_scaling,
                       float min_loss_scale);

// The sample's next character: temperature 0.8 over the real vocabulary, from the logits of
// the last position (`at` in the global logits); every rank draws the same character.
std::int32_t draw_next(const std::vector<float>& all, std::size_t at, std::size_t vocab,
                       std::mt19937_64& rng);

// Rank 0 at the end: the summary line and sample, the log's summary, the log and the plot.
void finish_run(const flags& f, zest::report::training_log& log, const std::string& mesh,
                double last_loss, double entropy, std::int64_t trained, double seconds,
                double tokens_per_step, const std::string& sample);

// The model of a run, by --arch: the model type for a policy, its options from the flags,
// and whether it has expert layers (--moe). llama_arch is defined in train_gpt_llama.hpp, and
// its runs are compiled in train_gpt_llama_<precision>.cpp only.
struct gpt_arch {
  template <class P>
  using model = zest::gpt<P>;
  static constexpr bool has_experts = true;
  static zest::gpt_options options(const flags& f, std::size_t vocab) {
    zest::gpt_options go;
    go.vocab = vocab;
    go.context = f.context;
    go.width = f.width;
    go.layers = f.layers;
    go.heads = f.heads;
    go.dropout = f.dropout;
    go.moe = f.moe;
    go.experts = f.experts;
    go.gating.top_k = f.top_k;
    go.gating.capacity_factor = f.capacity_factor;
    go.gating.dropless = f.moe_dropless;
    go.gating.bias_update_rate = f.bias_update_rate;
    go.aux_weight = f.aux_weight;
    return go;
  }
};
struct llama_arch;

template <class P, class Arch>
int train(const flags& f, const typename P::mesh_type& mesh, const zest::text_dataset& data) {
  using mesh_t = typename P::mesh_type;
  // Model states live where the mesh's backend keeps its buffers (host or device memory).
  auto& memory = zest::backend_of<mesh_t>::counters();
  const bool root = mesh.rank() == 0;
  zest::zero_options zo;
  zo.seed = f.seed;
  zo.max_grad_norm = f.clip;
  zo.initial_loss_scale = f.loss_scale;
  zo.recompute = zest::parse_recomputation(f.recompute);
  zest::zero_engine<P> engine(mesh, zo);

  const std::size_t vocab = padded_vocab(data.vocab_size());
  // Before the model: the sampler checks that the text holds a sequence of the context.
  zest::batch_sampler sampler(data.train(), f.batch, f.context, f.seed);
  const std::int64_t before_model = memory.live.load();
  typename Arch::template model<P> model(engine, Arch::options(f, vocab));
  const std::int64_t model_state_bytes = memory.live.load() - before_model;
  const auto params = engine.parameter_count();

  // Weights from elsewhere (Hugging Face's names; an MoE GPT's own names): a fresh start.
  const auto weights = [&] {
    if constexpr (Arch::has_experts) {
      if (f.moe) return zest::io::own_weight_map(engine);
    }
    return weight_map_of(model);
  };
  if (!f.init_from.empty()) {
    zest::io::import_safetensors(engine, weights(), f.init_from);
    if (root && !f.quiet) std::cout << "weights from " << f.init_from << '\n';
  }

  std::int64_t step = 0;
  if (!f.load.empty()) {
    // The data stream: the sampler's batches are its positions (batch k at step k). A
    // checkpoint saved before streams were recorded has none: it resumes as it did then.
    const zest::stream_state stream = zest::stream_cursor(sampler).state();
    const bool recorded = zest::stream_state_of(zest::io::read_checkpoint_info(f.load)).has_value();
    const auto info = zest::load_training_state(
        f.load, engine,
        {.corpus = data.identity(),
         .allow_other_corpus = false,
         .data = recorded ? std::optional<zest::stream_state>(stream) : std::nullopt,
         .allow_other_data = f.new_data});
    if (const auto saved = zest::stream_state_of(info); root && (f.new_data || !saved)) {
      const std::string d = saved ? zest::stream_difference(*saved, stream)
                                  : std::string("the checkpoint records no data stream");
      std::cout << "note: " << (f.new_data ? "--new-data: " : "")
                << (d.empty() ? "the same data stream" : d) << "; the batches continue at step "
                << info.step << " of this run's stream\n";
    }
    zest::json::value saved = info.metadata["config"];
    if constexpr (Arch::has_experts) {
      // The routing biases are state (balancing without an aux loss): resumed as saved.
      if (saved.is_object() && saved.contains("routing_bias"))
        model.set_routing_biases(routing_bias_of(saved["routing_bias"]));
    }
    if (saved.is_object())
      std::erase_if(saved.as_object(), [](const auto& m) {
        return m.first == "schedule" || m.first == "routing_bias";
      });
    // Same tensors (else load_training_state refused) but another batch or seed, say.
    if (const std::string other = settings_differing(saved, config_json(f, data.vocab_size()));
        root && !other.empty()) {
      std::cout << "note: the checkpoint was trained with other settings: " << other << '\n';
    }
    step = info.step;
  }

  const zest::warmup_cosine schedule = schedule_of(f);
  const double entropy = data.unigram_entropy().nats;

  const auto plan = zest::plan_zero<typename P::stage>(
      model.shape(), mesh,
      std::is_same_v<typename P::param_type, float> ? zest::fp32_adam : zest::mixed_precision_adam);
  // Every collective of a step, derived before the first: --explain prints it, the log keeps
  // it beside each step's recorded traffic (the check compares them).
  std::optional<zest::step_inventory> inventory;
  if constexpr (std::is_same_v<Arch, gpt_arch>) {
    mesh_sizes_t sizes{1, 1, 1, 1, 1};
    for (std::size_t a = 0; a < mesh_t::axis_count && a < sizes.size(); ++a)
      sizes[a] = mesh.size(a);
    // ZeRO over this rank's blocks over tp and ep (rank 0's: the log is rank 0's).
    const auto precision = std::is_same_v<typename P::param_type, float>
                               ? zest::fp32_adam
                               : zest::mixed_precision_adam;
    const auto blocks = zest::gpt_shape(Arch::options(f, vocab), static_cast<std::size_t>(sizes[3]),
                                        static_cast<std::size_t>(sizes[2]));
    // The collectives' element sizes are the tape's, float whatever the policy.
    try {
      inventory = zest::inventory_step(inventory_model(f, vocab), inventory_layout(f, sizes),
                                       zest::plan_zero<typename P::stage>(blocks, mesh, precision),
                                       zest::fp32_adam);
      const auto data_ranks = static_cast<std::size_t>(sizes[0] * sizes[1] * sizes[2]);
      if (f.batch % data_ranks != 0 && inventory->not_exact.empty())
        inventory->not_exact = "the batch does not divide over the data ranks";
    } catch (const zest::shape_error& e) {
      // A shape the run takes (uneven heads or sequence blocks) that the planner does not.
      inventory.emplace();
      inventory->model = "train_gpt";
      inventory->mesh = mesh.describe();
      inventory->not_exact = e.what();
    }
  }
  if (f.explain) {
    if (root) {
      if (inventory) std::cout << *inventory;
      else std::cout << "--explain: the inventory is derived for --arch gpt only\n";
    }
    return 0;
  }
  const std::string described = mesh.describe();
  std::size_t moe_layers = 0;
  if constexpr (Arch::has_experts) moe_layers = model.moe_layer_count();
  if (root && !f.quiet) {
    print_header(f, data, vocab, params, described, moe_layers, model_state_bytes,
                 static_cast<double>(plan.memory.total()), entropy);
  }

  zest::report::training_log log =
      start_log(f, data.vocab_size(), described, params, entropy, model_state_bytes,
                estimate_memory(f, mesh_sizes(f, mesh.world_size())), step);
  if (inventory) log.set("inventory", inventory_json(*inventory));

  // --save: at the end, and every --save-every steps; with --async-save each save's shards
  // are written while training goes on; the next save agrees on them and has rank 0 write
  // the manifest beside the training, and the one after (or the end) agrees on that commit.
  // The stall, the time the loop spends in a save, is kept per save.
  zest::io::pending_save committing, pending;
  std::vector<double> stalls;
  std::int64_t saved_step = -1;
  const auto save = [&](std::int64_t at_step) {
    const auto start = std::chrono::steady_clock::now();
    zest::json::value config = config_json(f, data.vocab_size());
    config["schedule"] = schedule_json(schedule);  // resolve_schedule reads it on --load
    if constexpr (Arch::has_experts) {
      if (f.moe && f.bias_update_rate > 0)
        config["routing_bias"] = routing_bias_json(model.routing_biases());
    }
    if (f.async_save) {
      // The save before last agreed; this one started; the last one's manifest written
      // beside the next steps (started last, so that its thread does not slow this call).
      committing.wait();
      zest::io::pending_save started = zest::save_training_state_async(
          f.save, engine, at_step, std::move(config), data.identity(),
          zest::stream_cursor(sampler, at_step).state());
      pending.start_commit();
      committing = std::move(pending);
      pending = std::move(started);
    } else {
      zest::save_training_state(f.save, engine, at_step, std::move(config), data.identity(),
                                zest::stream_cursor(sampler, at_step).state());
    }
    saved_step = at_step;
    (void)engine.take_held_seconds();  // a wait inside this save: counted below already
    stalls.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  };
  // The last save committed, its wait counted in its stall.
  const auto finish_saves = [&] {
    if (!committing.pending() && !pending.pending()) return;
    const auto start = std::chrono::steady_clock::now();
    committing.wait();
    pending.wait();
    stalls.back() +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  zest::report::progress_line progress(f.steps, (root && !f.quiet) ? stdout : nullptr);
  const double tokens_per_step = static_cast<double>(f.batch * f.context);
  double last_loss = std::nan("");
  double seconds = 0;
  std::int64_t trained = 0;
  for (; step < f.steps; ++step) {
    const auto [inputs, targets] =
        sampler.template batch<token_layout<P>>(mesh, static_cast<std::size_t>(step));
    const auto r = zest::train_step(engine, model, inputs, targets, schedule(step),
                                    zest::splitmix64(f.seed ^ static_cast<std::uint64_t>(step)));
    last_loss = r.loss;
    seconds += r.seconds;
    // An asynchronous save's shard still being written when the update came: its stall too.
    if (!stalls.empty()) stalls.back() += engine.take_held_seconds();
    ++trained;
    moe_figures moe;
    if constexpr (Arch::has_experts) {
      if (f.moe) {
        auto m = model.last_moe_report();
        moe = {m.nll,
               m.aux_loss,
               m.dropped_fraction,
               std::move(m.tokens_per_expert),
               std::move(m.load_per_expert),
               std::move(m.dropped_per_expert)};
        if (f.bias_update_rate > 0) model.update_routing_bias();
      }
    }
    const moe_figures* moe_if = f.moe ? &moe : nullptr;
    log.add_step(step_record(step, r, mesh.axis_names, tokens_per_step, P::loss_scaling, moe_if));
    // A skipped step always gets its line.
    if (root && !f.quiet &&
        (progress.on_terminal() || (step + 1) % f.print_every == 0 || step + 1 == f.steps ||
         step == 0 || !r.report.applied)) {
      progress.update(step + 1, progress_text(r, tokens_per_step, model_state_bytes, moe_if));
    }
    // The loss and the gradient norm are the same on every rank: every rank stops here, and
    // the job ends with exit status 1 and no abort (rank 0 says why).
    if (const std::string why =
            divergence(step, r, P::loss_scaling, engine.loss_scaler().min_scale());
        !why.empty()) {
      progress.finish();
      finish_saves();  // every rank is here: the save before the divergence is committed
      if (root) {
        if (!f.log.empty()) {
          log.set_summary("diverged_at_step", step + 1);
          log.set_summary("steps_trained", trained);
          log.write(f.log);
        }
        const std::string line =
            "[rank 0] " + why + (f.log.empty() ? "" : "; the log is in " + f.log) +
            (f.save.empty()   ? ""
             : saved_step < 0 ? "; nothing was saved"
                              : "; " + f.save + " holds step " + std::to_string(saved_step)) +
            "\n";
        std::fwrite(line.data(), 1, line.size(), stderr);
        std::fflush(stderr);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      return 1;
    }
    if (!f.save.empty() && f.save_every > 0 && (step + 1) % f.save_every == 0 &&
        step + 1 < f.steps) {
      save(step + 1);
    }
  }
  progress.finish();

  if (!f.save.empty()) {
    save(step);
    finish_saves();
    if (root && !f.quiet) {
      std::vector<double> sorted = stalls;
      std::sort(sorted.begin(), sorted.end());
      std::cout << "saved " << f.save << " at step " << step << " (" << stalls.size()
                << (stalls.size() == 1 ? " save" : " saves") << (f.async_save ? ", async" : "")
                << "; stall per save: median "
                << zest::report::format_number(1e3 * sorted[sorted.size() / 2], 3) << " ms)\n";
    }
    log.set_summary("save_stall_s",
                    zest::json::value(zest::json::array(stalls.begin(), stalls.end())));
  }
  if (!f.export_to.empty()) {
    zest::io::export_safetensors(engine, weights(), f.export_to);
    if (root && !f.quiet) std::cout << "exported " << f.export_to << " at step " << step << '\n';
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
      using ids_t = zest::tensor<std::int32_t, mesh_t, "bt", token_layout<P>>;
      const auto in =
          ids_t::generate(mesh, {rows, len}, [&](const auto& i) { return window[i[1]]; });
      zest::autodiff::tape t;
      const auto logits = model.logits(t, in);
      engine.discard_forward();
      const auto all = zest::to_global(logits.value());  // [rows, len, vocab] on every rank
      ids.push_back(draw_next(all, (len - 1) * vocab, data.vocab_size(), rng));
    }
    sample = data.decode(ids);
  }

  if (root) {
    finish_run(f, log, described, last_loss, entropy, trained, seconds, tokens_per_step, sample);
  }
  return 0;
}

// --zeropp: ZeRO++ (DeepSpeed), its three parts as layout choices on ZeRO-3 over the ranks
// of a node (dp) and the nodes: hpZ's secondary copy split within the node, so backward's
// all-gathers stay inside it; qwZ's and qgZ's int8 wires (blocks of 256) for the weight
// all-gathers and the gradients' reduce-scatter. The slow axis, node, goes last.
// Spelt out: nvcc's host-code generator loses the axis names' literals through the alias
// members (docs/design-notes.md, "Compiler notes"); it is
// zero_stage<3, "dp,node">::with_secondary_over<"dp">::with_quantized_weights<256>::
// with_quantized_gradients<256>.
using zeropp_stage = zest::zero_stage<3, "dp,node", zest::split_first_dim, "", "dp", 256, 256>;
// The one build of the model with it: fp32 GPT on the CPU mesh (a policy is a type, so each
// precision, architecture and device would compile the model once more; check_run refuses
// the others).
template <class Mesh, class Param, class Arch>
constexpr bool builds_zeropp() {
  return Mesh::axis_count == 5 && std::is_same_v<Param, float> && std::is_same_v<Arch, gpt_arch>;
}

template <class Mesh, class Param, class Arch = gpt_arch>
int train_with_precision(const flags& f, const Mesh& mesh, const zest::text_dataset& data) {
  if constexpr (builds_zeropp<Mesh, Param, Arch>()) {
    if (!f.zeropp.empty()) {
      return train<zest::training_policy<Mesh, zeropp_stage, Param>, Arch>(f, mesh, data);
    }
  }
  return zest::with_zero_stage<"dp", zest::split_first_dim, "node">(f.zero, [&](auto stage) {
    return train<zest::training_policy<Mesh, decltype(stage), Param>, Arch>(f, mesh, data);
  });
}

// The mesh over all ranks ("node" x "dp" x "ep" x "tp" x "sp" = sizes; a mesh of three
// axes takes the first three, tp and sp being 1) and the run of the model in the precision
// asked for.
template <class Mesh, class Arch, class... Precisions>
int train_on(const flags& f, const zest::text_dataset& data, mesh_sizes_t sizes) {
  std::array<int, Mesh::axis_count> own{};
  for (std::size_t a = 0; a < own.size(); ++a) own[a] = sizes[a];
  const Mesh mesh(MPI_COMM_WORLD, own);
  if (f.precision == "bf16") return train_with_precision<Mesh, zest::bfloat16, Arch>(f, mesh, data);
  if constexpr ((std::is_same_v<Precisions, zest::float16> || ...)) {
    if (f.precision == "fp16")
      return train_with_precision<Mesh, zest::float16, Arch>(f, mesh, data);
  }
  return train_with_precision<Mesh, float, Arch>(f, mesh, data);
}

// --device cpu: the mesh of train_gpt.cpp's runs. Their three precisions are compiled apart,
// in train_gpt_fp32.cpp, train_gpt_bf16.cpp and train_gpt_fp16.cpp (explicit instantiations
// of train_with_precision<cpu_mesh, ...>, declared extern in train_gpt.cpp), and those of
// --arch llama in train_gpt_llama_fp32.cpp, ... (train_with_precision<cpu_mesh, ...,
// llama_arch>).
using cpu_mesh = zest::mesh<"node", "dp", "ep", "tp", "sp">;

// --device cuda: defined in train_gpt_cuda.cu, compiled by nvcc when the build has CUDA.
int train_on_cuda(const flags& f, const zest::text_dataset& data, mesh_sizes_t sizes);

}  // namespace train_gpt_example
