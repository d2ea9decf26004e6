// train_gpt — zest's main job: a GPT trained on the text every Debian system ships, with a
// ZeRO stage chosen on the command line, on any number of MPI ranks.
//
//   mpiexec -n 2 build/default/examples/train_gpt                   # ZeRO-3, the default run
//   mpiexec -n 4 build/default/examples/train_gpt --zero 1 --steps 50 --log run.json
//   build/default/examples/train_gpt --help
//
// Rank 0 prints a progress line per step (loss, tokens/s, model-state and peak memory per
// rank, bytes communicated), then a sample of generated text; --log writes the run as JSON,
// --plot the loss curve as SVG, --save/--load a sharded checkpoint (loadable on another
// number of ranks or another stage). The numbers do not depend on the number of ranks:
// batches, initialisation and dropout are functions of the seed and the global indices.
#include <mpi.h>

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>

#include "train_gpt.hpp"
#include "train_gpt_llama.hpp"
#include "zest/report/svg_plot.hpp"

// The runs themselves, one translation unit per precision (train_gpt_fp32.cpp, ...): this
// one parses the flags, picks the run, and holds what the runs share.
namespace train_gpt_example {
extern template int train_with_precision<cpu_mesh, float>(const flags&, const cpu_mesh&,
                                                          const zest::text_dataset&);
extern template int train_with_precision<cpu_mesh, zest::bfloat16>(const flags&, const cpu_mesh&,
                                                                   const zest::text_dataset&);
extern template int train_with_precision<cpu_mesh, zest::float16>(const flags&, const cpu_mesh&,
                                                                  const zest::text_dataset&);
// --arch llama: train_gpt_llama_fp32.cpp, ...
extern template int train_with_precision<cpu_mesh, float, llama_arch>(const flags&, const cpu_mesh&,
                                                                      const zest::text_dataset&);
extern template int train_with_precision<cpu_mesh, zest::bfloat16, llama_arch>(
    const flags&, const cpu_mesh&, const zest::text_dataset&);
extern template int train_with_precision<cpu_mesh, zest::float16, llama_arch>(
    const flags&, const cpu_mesh&, const zest::text_dataset&);

// The policy-independent parts of a run (declared in train_gpt.hpp).

// The options: each one's name, value, help text and range are defined once, in this
// table; the parser and --help both read it.
struct option {
  std::string_view name;                              // "--dropout"
  std::string_view value;                             // "X"; empty for a switch
  std::string help;                                   // what it does
  std::string limits;                                 // its range and default: "N >= 1 (10)"
  std::function<void(flags&, std::string_view)> set;  // parses and checks the value
};

namespace detail {

// Every refusal of the options reads "train_gpt: <why>".
[[noreturn]] void fail(const std::string& why) { throw std::invalid_argument("train_gpt: " + why); }

[[noreturn]] void refuse(std::string_view option, std::string_view text,
                         std::string_view expected) {
  fail(std::string(option) + " " + std::string(text) + ": expected " + std::string(expected));
}

template <class T>
std::string number_text(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return zest::report::format_number(static_cast<double>(v), 6);
  } else {
    return std::to_string(v);
  }
}

// "N in 1..1048576", "N >= 1", "X in [0, 1)", "X > 0" (finite, for X).
template <class T>
std::string range_text(std::string_view value, T lo, T hi, bool lo_open, bool hi_open) {
  const std::string v(value);
  const bool unbounded = hi == std::numeric_limits<T>::max();
  if constexpr (std::is_integral_v<T>) {
    if (unbounded) return v + " >= " + number_text(lo);
    if (hi == lo + 1) return v + " = " + number_text(lo) + " or " + number_text(hi);
    return v + " in " + number_text(lo) + ".." + number_text(hi);
  } else {
    if (unbounded) return "finite " + v + (lo_open ? " > " : " >= ") + number_text(lo);
    return v + " in " + (lo_open ? "(" : "[") + number_text(lo) + ", " + number_text(hi) +
           (hi_open ? ")" : "]");
  }
}

}  // namespace detail

// A number in [lo, hi] (an end excluded when open; hi = max means none), finite.
template <class T>
option number_option(std::string_view name, std::string_view value, T flags::*member, T lo, T hi,
                     std::string_view help, bool lo_open = false, bool hi_open = false,
                     std::string default_text = {}) {
  const std::string range = detail::range_text(value, lo, hi, lo_open, hi_open);
  if (default_text.empty()) default_text = detail::number_text(flags{}.*member);
  return {name, value, std::string(help), range + " (" + default_text + ")",
          [=](flags& f, std::string_view text) {
            T v{};
            const char* end = text.data() + text.size();
            const auto [ptr, ec] = std::from_chars(text.data(), end, v);
            if (ec != std::errc() || ptr != end || text.empty())
              detail::refuse(name, "'" + std::string(text) + "'", "a number, " + range);
            bool ok = v >= lo && v <= hi && !(lo_open && v == lo) && !(hi_open && v == hi);
            if constexpr (std::is_floating_point_v<T>) ok = ok && std::isfinite(v);
            if (!ok) detail::refuse(name, text, range);
            f.*member = v;
          }};
}

// A path (not empty).
inline option path_option(std::string_view name, std::string_view value, std::string flags::*member,
                          std::string_view help) {
  return {name, value, std::string(help), "not empty", [=](flags& f, std::string_view text) {
            if (text.empty()) detail::refuse(name, "''", "a path, not an empty word");
            f.*member = text;
          }};
}

// --zeropp: the parts of ZeRO++, a comma-separated list of hpz, qwz and qgz, each once. The
// example builds the three together (one policy: zeropp_stage in train_gpt.hpp); a program
// chooses each part alone in its zero_stage (README).
inline option zeropp_option() {
  return {"--zeropp", "LIST",
          "ZeRO++ on ZeRO-3 over dp and --nodes: hpZ (backward's all-\n"
          "gathers inside a node), qwZ (weight all-gathers in int8),\n"
          "qgZ (gradients reduce-scattered in int8); fp32 GPT on the CPU",
          "hpz,qwz,qgz (off)", [](flags& f, std::string_view text) {
            const std::vector<std::string> parts{"hpz", "qwz", "qgz"};
            std::vector<std::string> seen;
            std::size_t begin = 0;
            while (begin <= text.size()) {
              std::size_t end = text.find(',', begin);
              if (end == std::string_view::npos) end = text.size();
              const std::string part(text.substr(begin, end - begin));
              if (std::find(parts.begin(), parts.end(), part) == parts.end() ||
                  std::find(seen.begin(), seen.end(), part) != seen.end()) {
                detail::refuse("--zeropp", "'" + std::string(text) + "'",
                               "hpz, qwz and qgz separated by commas, each once");
              }
              seen.push_back(part);
              begin = end + 1;
            }
            if (seen.size() != parts.size()) {
              detail::refuse("--zeropp", "'" + std::string(text) + "'",
                             "hpz,qwz,qgz: this example builds ZeRO++'s three parts together "
                             "(a program chooses each alone in its zero_stage: README)");
            }
            f.zeropp = "hpz,qwz,qgz";
          }};
}

// One of a few words.
inline option choice_option(std::string_view name, std::string_view value,
                            std::string flags::*member, std::vector<std::string> choices,
                            std::string_view help) {
  std::string list;
  for (std::size_t i = 0; i < choices.size(); ++i)
    list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return {name, value, std::string(help), list + " (" + flags{}.*member + ")",
          [=](flags& f, std::string_view text) {
            if (std::find(choices.begin(), choices.end(), text) == choices.end())
              detail::refuse(name, "'" + std::string(text) + "'", list);
            f.*member = text;
          }};
}

inline option switch_option(std::string_view name, bool flags::*member, std::string_view help) {
  return {name, "", std::string(help), "", [=](flags& f, std::string_view) { f.*member = true; }};
}

// Sizes are bounded so that the memory estimate (check_memory) never overflows; the
// estimate then refuses what this machine cannot hold.
inline constexpr std::size_t max_extent = std::size_t{1} << 20;
inline constexpr std::size_t max_layers = std::size_t{1} << 30;

inline const std::vector<option>& options() {
  using zf = flags;
  constexpr auto i64max = std::numeric_limits<std::int64_t>::max();
  constexpr auto dmax = std::numeric_limits<double>::max();
  static const std::vector<option> table = {
      choice_option("--arch", "A", &zf::arch, {"gpt", "llama"},
                    "gpt: GPT-2 (LayerNorm, GELU MLP, learned positions, biases);\n"
                    "llama: RMSNorm, SwiGLU MLP, RoPE, grouped-query attention,\n"
                    "no biases (examples/llama.hpp)"),
      number_option<int>("--zero", "N", &zf::zero, 0, 3, "ZeRO stage: 0 (DDP), 1, 2 or 3"),
      number_option<std::int64_t>("--steps", "N", &zf::steps, 0, i64max,
                                  "train until step N, counted from the start of training"),
      number_option<std::int64_t>(
          "--schedule-steps", "N", &zf::schedule_steps, 1, i64max,
          "length of the learning-rate schedule (warmup, then cosine to\n"
          "--min-lr at step N); a checkpoint keeps it and --load continues it",
          false, false, "--steps; with --load, the checkpoint's"),
      number_option<std::uint64_t>("--seed", "N", &zf::seed, 0,
                                   std::numeric_limits<std::uint64_t>::max(),
                                   "initialisation, batches and dropout"),
      number_option<std::size_t>("--batch", "N", &zf::batch, 1, max_extent,
                                 "global batch in sequences, split over the ranks"),
      number_option<std::size_t>("--context", "N", &zf::context, 1, max_extent, "sequence length"),
      number_option<std::size_t>("--width", "N", &zf::width, 1, max_extent,
                                 "model width, a multiple of --heads"),
      number_option<std::size_t>("--layers", "N", &zf::layers, 1, max_layers, "transformer blocks"),
      number_option<std::size_t>("--heads", "N", &zf::heads, 1, max_extent, "attention heads"),
      number_option<std::size_t>("--kv-heads", "N", &zf::kv_heads, 1, max_extent,
                                 "--arch llama: key/value heads, dividing --heads\n"
                                 "(grouped-query attention; 1: multi-query)",
                                 false, false, "--heads"),
      number_option<std::size_t>("--hidden", "N", &zf::hidden, 1, max_extent,
                                 "--arch llama: the SwiGLU MLP's hidden width", false, false,
                                 "8/3 --width rounded up to a multiple of 32"),
      switch_option("--tie-head", &zf::tie_head,
                    "--arch llama: the output head is the token embedding's table\n"
                    "(without it, a head of its own)"),
      number_option<double>("--rope-base", "X", &zf::rope_base, 0, dmax,
                            "--arch llama: RoPE's base (theta)", true),
      number_option<double>("--lr", "X", &zf::lr, 0, dmax,
                            "peak learning rate (warmup, then cosine to --min-lr)", true),
      number_option<double>("--min-lr", "X", &zf::min_lr, 0, dmax,
                            "final learning rate, at most --lr"),
      number_option<std::int64_t>("--warmup", "N", &zf::warmup, 0, i64max,
                                  "warmup steps (at most the schedule's length)"),
      switch_option("--new-schedule", &zf::new_schedule,
                    "with --load: follow this run's --lr, --min-lr, --warmup and\n"
                    "--schedule-steps where they differ from the checkpoint's schedule\n"
                    "(without it, a difference is refused)"),
      number_option<double>("--dropout", "X", &zf::dropout, 0, 1, "dropout probability", false,
                            true),
      choice_option("--recompute", "R", &zf::recompute, {"none", "selective", "full"},
                    "activation recomputation in backward: selective, the attention\n"
                    "core (scores, probabilities); full, each block from its input"),
      number_option<double>("--clip", "X", &zf::clip, 0, dmax,
                            "global gradient-norm clipping, 0 for none"),
      choice_option("--precision", "P", &zf::precision, {"fp32", "bf16", "fp16"},
                    "bf16: bfloat16 parameters and gradients, fp32 master and Adam;\n"
                    "fp16: float16, dynamic loss scaling"),
      number_option<float>("--loss-scale", "X", &zf::loss_scale, 1,
                           std::numeric_limits<float>::max(),
                           "fp16: the loss scaler's first scale (halved at every\n"
                           "overflow, doubled after 200 good steps)"),
      choice_option("--device", "D", &zf::device, {"cpu", "cuda"},
                    "cuda: one GPU per rank, NCCL (builds with CUDA)"),
      path_option("--corpus", "PATH", &zf::corpus,
                  "a text file or a folder of text files, at most 1 GiB\n"
                  "(default /usr/share/common-licenses)"),
      path_option("--log", "FILE", &zf::log,
                  "the run as JSON: run settings and steps [{step, loss, ...}]\n"
                  "(non-finite numbers as null, named in \"nonfinite\")"),
      path_option("--plot", "FILE", &zf::plot, "the loss curve as SVG"),
      path_option("--save", "DIR", &zf::save, "a sharded checkpoint at the end"),
      path_option("--load", "DIR", &zf::load,
                  "resume from a checkpoint (any number of ranks, any stage)"),
      number_option<std::int64_t>("--save-every", "N", &zf::save_every, 1, i64max,
                                  "--save: a checkpoint every N steps too (each replacing\n"
                                  "the last), not only at the end",
                                  false, false, "--save: at the end only"),
      switch_option("--async-save", &zf::async_save,
                    "--save: the shards written while training goes on (the next\n"
                    "save or the end commits each); the optimizer's update waits\n"
                    "for a shard still being written"),
      switch_option("--new-data", &zf::new_data,
                    "--load: continue in another data stream than the checkpoint's\n"
                    "(another --batch, --seed or corpus text: another order of\n"
                    "batches) from its step; the difference is printed"),
      path_option("--export", "F", &zf::export_to,
                  "the weights at the end as safetensors, Hugging Face's names\n"
                  "(GPT-2 or Llama; --moe: zest's own); F ending in '/' is a\n"
                  "folder: F/model.safetensors and F/config.json"),
      path_option("--init-from", "F", &zf::init_from,
                  "start from these weights (a file --export wrote, or one of\n"
                  "Hugging Face's); any ranks, stage, --tp"),
      number_option<std::int64_t>("--sample", "N", &zf::sample, 0, 1000000,
                                  "characters of generated text at the end, 0 for none"),
      number_option<std::int64_t>("--print-every", "N", &zf::print_every, 1, i64max,
                                  "a progress line every N steps when not on a terminal"),
      switch_option("--moe", &zf::moe,
                    "every other block's MLP becomes a GShard mixture of experts"),
      number_option<std::size_t>("--experts", "N", &zf::experts, 1, 65536,
                                 "--moe: experts per MoE layer, at least --top-k"),
      number_option<int>("--top-k", "K", &zf::top_k, 1, 65536,
                         "--moe: experts per token: 2 (GShard), 1 (Switch), any k up to --experts"),
      switch_option("--moe-capacity", &zf::moe_capacity,
                    "--moe: experts of fixed capacity, tokens over it dropped (the default)"),
      switch_option("--moe-dropless", &zf::moe_dropless,
                    "--moe: every expert computes exactly the tokens routed to it"),
      number_option<double>("--bias-update-rate", "U", &zf::bias_update_rate, 0, dmax,
                            "--moe: balance by a routing bias, moved by U per step towards\n"
                            "the mean load (DeepSeek-V3; 0: off)"),
      number_option<double>("--capacity-factor", "F", &zf::capacity_factor, 0, dmax,
                            "--moe: expert capacity factor", true),
      number_option<double>("--aux-weight", "W", &zf::aux_weight, 0, dmax,
                            "--moe: weight of the load-balancing loss"),
      number_option<int>("--ep", "N", &zf::ep, 0, std::numeric_limits<int>::max(),
                         "--moe: ranks of the expert axis, dividing the ranks and\n"
                         "the experts; the data axis takes the rest (0: the largest such)"),
      number_option<int>("--tp", "N", &zf::tp, 1, std::numeric_limits<int>::max(),
                         "tensor-parallel ranks, dividing the ranks: heads, the MLP's\n"
                         "hidden dim and the vocabulary split over them (Megatron), with\n"
                         "sequence parallelism between; dp (and ep) take the rest"),
      number_option<int>("--sp", "N", &zf::sp, 1, std::numeric_limits<int>::max(),
                         "Ulysses sequence-parallel ranks, dividing the ranks: the\n"
                         "sequence split over them, the attention over heads by\n"
                         "all-to-alls; with --tp, tp splits inside each sp block"),
      number_option<int>("--hsdp", "N", &zf::hsdp, 1, std::numeric_limits<int>::max(),
                         "hybrid sharding (HSDP): the data-parallel ranks in N replica\n"
                         "groups; ZeRO partitions within a group (dp) and the groups hold\n"
                         "replicas (node: gradients all-reduced across, one shard each)"),
      zeropp_option(),
      number_option<int>("--nodes", "N", &zf::nodes, 1, std::numeric_limits<int>::max(),
                         "--zeropp: the data-parallel ranks in N nodes (the node axis:\n"
                         "ZeRO partitions over dp and the nodes, hpZ's copy within one)"),
      switch_option("--checked", &zf::checked,
                    "checked mode (as ZEST_CHECKED=1): before every collective the\n"
                    "ranks compare what they call, so a mismatch is an error naming\n"
                    "the ranks, not wrong numbers or a hang"),
      switch_option("--quiet", &zf::quiet, "no progress output"),
      switch_option("--explain", &zf::explain,
                    "print every collective of one training step (per mesh axis:\n"
                    "kind, calls, bytes), as the planner derives it, and stop;\n"
                    "the log of a run holds the same inventory beside each step's\n"
                    "recorded traffic (--arch gpt)"),
  };
  return table;
}

std::string usage() {
  std::string u =
      "usage: train_gpt [options]   (under mpiexec -n N for N data-parallel ranks)\n"
      "\n"
      "Trains a byte-level GPT (or, with --arch llama, a Llama-style decoder) on\n"
      "/usr/share/common-licenses (or --corpus) with ZeRO.\n"
      "Every option is checked before the run starts: a value out of its range, an output\n"
      "that cannot be written or a model this machine's memory cannot hold is refused.\n"
      "\n";
  // "  --name V" in 22 columns, the help beside it, the limits after it (on a line of their
  // own when the help's last line has no room for them).
  constexpr std::size_t column = 22, width = 92;
  const std::string indent(column, ' ');
  const auto line = [&](std::string left, const std::string& help, const std::string& limits) {
    left = "  " + left;
    left += left.size() < column ? std::string(column - left.size(), ' ') : " ";
    std::string text;
    for (char c : help) text += c == '\n' ? "\n" + indent : std::string(1, c);
    if (!limits.empty()) {
      const std::size_t last = text.size() - std::min(text.size(), text.rfind('\n') + 1);
      text += column + last + 2 + limits.size() <= width ? "; " + limits : "\n" + indent + limits;
    }
    u += left + text + "\n";
  };
  for (const auto& o : options())
    line(std::string(o.name) + (o.value.empty() ? "" : " " + std::string(o.value)), o.help,
         o.limits);
  line("--help", "this text", "");
  return u;
}

std::optional<flags> parse(int argc, char** argv) {
  flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") return std::nullopt;
    const auto& table = options();
    const auto o =
        std::find_if(table.begin(), table.end(), [&](const option& x) { return x.name == a; });
    if (o == table.end()) {
      if (!a.starts_with("-"))
        throw std::invalid_argument("train_gpt: unexpected argument '" + std::string(a) +
                                    "' (options start with --; see --help)");
      throw std::invalid_argument("train_gpt: unknown option " + std::string(a) + " (see --help)");
    }
    if (f.was_given(a))
      throw std::invalid_argument("train_gpt: " + std::string(a) + " is given twice");
    f.given.emplace_back(a);
    if (o->value.empty()) {
      o->set(f, {});
      continue;
    }
    if (i + 1 >= argc || std::string_view(argv[i + 1]).starts_with("--"))
      throw std::invalid_argument("train_gpt: " + std::string(a) + " needs a value (" +
                                  std::string(o->value) + ")");
    o->set(f, argv[++i]);
  }
  return f;
}

void print_header(const flags& f, const zest::text_dataset& data, std::size_t vocab,
                  std::size_t params, const std::string& mesh, std::size_t moe_layers,
                  std::int64_t model_state_bytes, double planner_bytes, double entropy) {
  std::cout << "train_gpt: " << zest::report::format_count(static_cast<double>(params))
            << " parameters, " << f.layers << " layers, width " << f.width << ", vocab "
            << data.vocab_size() << " (padded " << vocab << "), ZeRO-" << f.zero
            << (f.zeropp.empty() ? std::string() : " ZeRO++ " + f.zeropp) << ", " << f.precision
            << ", " << mesh << ", batch " << f.batch << " x " << f.context << " tokens"
            << (f.recompute != "none" ? ", recompute " + f.recompute : std::string())
            << (f.arch == "llama"
                    ? ", llama: " + std::to_string(f.kv_heads) + " kv heads of " +
                          std::to_string(f.heads) + ", SwiGLU hidden " + std::to_string(f.hidden) +
                          (f.tie_head ? ", tied head" : ", untied head") + ", RoPE base " +
                          zest::report::format_number(f.rope_base, 6)
                    : std::string())
            << (f.moe ? ", MoE " + std::to_string(f.experts) + " experts top-" +
                            std::to_string(f.top_k) + " in " + std::to_string(moe_layers) +
                            " layers" + (f.moe_dropless ? ", dropless" : "") +
                            (f.bias_update_rate > 0 ? ", balanced by a routing bias" : "")
                      : std::string())
            << '\n';
  std::cout << "model states per rank: "
            << zest::report::format_bytes(static_cast<double>(model_state_bytes));
  // The planner's model has every parameter replicated off the data axis (no experts).
  if (!f.moe) std::cout << " (planner: " << zest::report::format_bytes(planner_bytes) << ")";
  std::cout << "; unigram entropy of the text " << entropy << " nats\n";
  if (zest::checked_mode().enabled)
    std::cout << "checked mode: on (every collective compared across the ranks first)\n";
}

zest::report::training_log start_log(const flags& f, std::size_t vocab, const std::string& mesh,
                                     std::size_t params, double entropy,
                                     std::int64_t model_state_bytes, const memory_need& estimate,
                                     std::int64_t step) {
  zest::report::training_log log;
  if (!f.log.empty() && !f.load.empty() && std::filesystem::exists(f.log)) {
    log = zest::report::training_log::read(f.log);
    log.drop_steps_after(step);
  }
  log.set("config", config_json(f, vocab));
  log.set("arch", f.arch);
  log.set("schedule", schedule_json(schedule_of(f)));
  log.set("zero_stage", static_cast<std::int64_t>(f.zero));
  log.set("zeropp", f.zeropp);
  log.set("precision", f.precision);
  log.set("recompute", f.recompute);
  log.set("mesh", mesh);
  log.set("parameters", static_cast<std::int64_t>(params));
  log.set("unigram_entropy_nats", entropy);
  log.set("model_state_bytes_per_rank", static_cast<std::int64_t>(model_state_bytes));
  zest::json::object need;
  need.emplace_back("model_states", estimate.model_states);
  need.emplace_back("activations", estimate.activations);
  need.emplace_back("bookkeeping", estimate.bookkeeping);
  need.emplace_back("total", estimate.total());
  log.set("memory_estimate_per_rank", zest::json::value(std::move(need)));
  return log;
}

zest::transformer_config inventory_model(const flags& f, std::size_t vocab) {
  zest::transformer_config c =
      zest::gpt_transformer("train_gpt", f.layers, f.width, f.heads, vocab, f.context);
  c.tied_output = false;  // zest::gpt: lm_head of its own
  c.fused_qkv = false;    // q, k and v apart
  c.dropout = f.dropout > 0;
  if (f.moe) {
    c.experts = f.experts;
    c.top_k = static_cast<std::size_t>(f.top_k);
    c.moe_every = zest::gpt_options{}.moe_every;
    c.capacity_factor = f.capacity_factor;
    c.dropless = f.moe_dropless;
    c.experts_split_over_tp = false;  // the experts see whole sequences on every tp rank
  }
  return c;
}

zest::parallel_layout inventory_layout(const flags& f, mesh_sizes_t sizes) {
  zest::parallel_layout p;
  p.dp_replicas = sizes[0];
  p.dp = sizes[1];
  p.ep = sizes[2];
  p.tp = sizes[3];
  p.sp = sizes[4];
  p.zero_stage = f.zeropp.empty() ? f.zero : 3;
  // The tokens are split over tp between its regions (token_layout): Megatron's SP.
  p.sequence_parallel = sizes[3] > 1;
  p.recompute = zest::parse_recomputation(f.recompute);
  p.micro_batch = f.batch / static_cast<std::size_t>(sizes[0] * sizes[1] * sizes[2]);
  return p;
}

zest::json::value inventory_json(const zest::step_inventory& inv) {
  zest::json::object out;
  if (!inv.not_exact.empty()) out.emplace_back("not_exact", inv.not_exact);
  zest::json::array lines;
  for (const auto& l : inv.lines()) {
    zest::json::object o;
    o.emplace_back("axis", l.axis);
    o.emplace_back("kind", std::string(zest::name_of(l.kind)));
    o.emplace_back("calls", static_cast<std::int64_t>(l.calls));
    o.emplace_back("bytes", static_cast<std::int64_t>(l.bytes));
    if (l.data_dependent) o.emplace_back("data_dependent", true);
    o.emplace_back("what", l.what);
    lines.emplace_back(std::move(o));
  }
  out.emplace_back("lines", std::move(lines));
  return out;
}

zest::json::value step_record(std::int64_t step, const zest::train_step_result& r,
                              std::span<const std::string_view> axes, double tokens_per_step,
                              bool loss_scaling, const moe_figures* moe) {
  zest::json::object rec;
  rec.emplace_back("step", step + 1);
  rec.emplace_back("loss", r.loss);
  rec.emplace_back("lr", r.report.lr);
  rec.emplace_back("grad_norm", r.report.grad_norm);
  rec.emplace_back("applied", r.report.applied);
  rec.emplace_back("seconds", r.seconds);
  rec.emplace_back("forward_s", r.forward_seconds);
  rec.emplace_back("backward_s", r.backward_seconds);
  rec.emplace_back("update_s", r.update_seconds);
  rec.emplace_back("tokens_per_s", tokens_per_step / r.seconds);
  rec.emplace_back("bytes_sent", static_cast<std::int64_t>(r.traffic.bytes_sent()));
  rec.emplace_back("scalar_bytes_sent", static_cast<std::int64_t>(r.scalar_traffic.bytes_sent()));
  {
    zest::json::object traffic;
    for (std::size_t a = 0; a < r.traffic_by_axis.size() && a < axes.size(); ++a) {
      zest::json::object kinds;
      for (std::size_t k = 0; k < zest::collective_kinds; ++k) {
        const auto& c = r.traffic_by_axis[a].by_kind[k];
        if (c.calls == 0) continue;
        zest::json::array figures;
        figures.emplace_back(static_cast<std::int64_t>(c.calls));
        figures.emplace_back(static_cast<std::int64_t>(c.bytes_sent));
        kinds.emplace_back(std::string(zest::name_of(static_cast<zest::collective>(k))),
                           std::move(figures));
      }
      traffic.emplace_back(std::string(axes[a]), std::move(kinds));
    }
    rec.emplace_back("traffic", std::move(traffic));
  }
  rec.emplace_back("peak_bytes", r.peak_bytes);
  if (loss_scaling) rec.emplace_back("loss_scale", static_cast<double>(r.report.loss_scale));
  if (moe) {
    rec.emplace_back("nll", moe->nll);
    rec.emplace_back("aux_loss", moe->aux_loss);
    rec.emplace_back("dropped_fraction", moe->dropped_fraction);
    const auto array = [](const std::vector<std::int64_t>& v) {
      zest::json::array a;
      for (auto c : v) a.emplace_back(c);
      return a;
    };
    rec.emplace_back("tokens_per_expert", array(moe->tokens_per_expert));
    rec.emplace_back("load_per_expert", array(moe->load_per_expert));
    rec.emplace_back("dropped_per_expert", array(moe->dropped_per_expert));
  }
  return zest::json::value(std::move(rec));
}

std::string progress_text(const zest::train_step_result& r, double tokens_per_step,
                          std::int64_t model_state_bytes, const moe_figures* moe) {
  std::ostringstream line;
  line.precision(4);
  line << "loss " << zest::report::format_number(r.loss) << "  "
       << zest::report::format_count(tokens_per_step / r.seconds) << " tok/s  states "
       << zest::report::format_bytes(static_cast<double>(model_state_bytes)) << "  peak "
       << zest::report::format_bytes(static_cast<double>(r.peak_bytes)) << "  sent "
       << zest::report::format_bytes(static_cast<double>(r.traffic.bytes_sent())) << "/step";
  if (moe) {
    const auto [lo, hi] =
        std::minmax_element(moe->tokens_per_expert.begin(), moe->tokens_per_expert.end());
    line << "  aux " << zest::report::format_number(moe->aux_loss) << "  dropped "
         << zest::report::format_number(100 * moe->dropped_fraction) << "%  experts max/min " << *hi
         << "/" << *lo << " tok";
    if (!moe->load_per_expert.empty()) {
      // Every choice (all k): the load per expert, and the drops per expert where any.
      line << "  load";
      for (auto c : moe->load_per_expert) line << ' ' << c;
      std::int64_t dropped = 0;
      for (auto c : moe->dropped_per_expert) dropped += c;
      if (dropped > 0) {
        line << "  drops";
        for (auto c : moe->dropped_per_expert) line << ' ' << c;
      }
    }
  }
  if (!r.report.applied)
    line << "  (skipped: inf/nan gradients at loss scale "
         << zest::report::format_number(r.report.loss_scale, 8) << ")";
  else if (!std::isfinite(r.report.grad_norm))
    line << "  (gradient norm " << zest::report::format_number(r.report.grad_norm) << ")";
  return line.str();
}

std::string divergence(std::int64_t step, const zest::train_step_result& r, bool loss_scaling,
                       float min_loss_scale) {
  using zest::report::format_number;
  const std::string at = "train_gpt: training diverged at step " + std::to_string(step + 1) +
                         ": loss " + format_number(r.loss, 6) + ", gradient norm " +
                         format_number(r.report.grad_norm, 6) + ", lr " +
                         format_number(r.report.lr, 6);
  if (!std::isfinite(r.loss))
    return at + " (the forward pass is no longer finite; try a smaller --lr, or --clip)";
  if (!loss_scaling && !std::isfinite(r.report.grad_norm))
    return at + " (non-finite gradients reached the parameters; try a smaller --lr, or --clip)";
  if (loss_scaling && !r.report.applied && r.report.loss_scale <= min_loss_scale)
    return at + " (the gradients overflow even at the smallest loss scale, " +
           format_number(min_loss_scale) + "; try a smaller --lr, or --precision bf16)";
  return {};
}

std::int32_t draw_next(const std::vector<float>& all, std::size_t at, std::size_t vocab,
                       std::mt19937_64& rng) {
  std::vector<double> w(vocab);
  double top = -1e30;
  for (std::size_t c = 0; c < w.size(); ++c) top = std::max(top, static_cast<double>(all[at + c]));
  for (std::size_t c = 0; c < w.size(); ++c) w[c] = std::exp((all[at + c] - top) / 0.8);
  std::discrete_distribution<int> pick(w.begin(), w.end());
  return pick(rng);
}

void finish_run(const flags& f, zest::report::training_log& log, const std::string& mesh,
                double last_loss, double entropy, std::int64_t trained, double seconds,
                double tokens_per_step, const std::string& sample) {
  if (!f.quiet) {
    if (trained == 0) {
      std::cout << "no steps trained (--steps " << f.steps << ")\n";
    } else {
      std::cout << "final loss " << zest::report::format_number(last_loss)
                << " nats (unigram entropy " << zest::report::format_number(entropy) << "), "
                << trained << " steps in " << zest::report::format_duration(seconds) << ", "
                << zest::report::format_count(tokens_per_step * static_cast<double>(trained) /
                                              seconds)
                << " tok/s\n";
    }
    if (!sample.empty()) std::cout << "sample:\n" << sample << "\n";
  }
  if (trained > 0) log.set_summary("final_loss", last_loss);  // no entry: no step trained
  log.set_summary("steps_trained", trained);
  log.set_summary("seconds", seconds);
  if (!sample.empty()) log.set_summary("sample", sample);
  if (!f.log.empty()) log.write(f.log);
  if (!f.plot.empty()) {
    zest::report::series loss{"loss", {}, {}};
    zest::report::series aux{"aux loss (right axis)", {}, {}};
    aux.secondary_axis = true;
    const auto j = log.to_json();
    using zest::report::training_log;
    for (const auto& s : j["steps"].as_array()) {
      // A non-finite loss is a gap in the curve.
      if (const double y = training_log::number(s, "loss"); std::isfinite(y)) {
        loss.x.push_back(s["step"].as_number());
        loss.y.push_back(y);
      }
      if (s.contains("aux_loss")) {
        if (const double a = training_log::number(s, "aux_loss"); std::isfinite(a)) {
          aux.x.push_back(s["step"].as_number());
          aux.y.push_back(a);
        }
      }
    }
    zest::report::plot_options po;
    po.title = "train_gpt: " + (f.arch == "gpt" ? std::string() : f.arch + ", ") + "ZeRO-" +
               std::to_string(f.zero) + ", " + mesh;
    po.y_label = "loss (nats)";
    po.reference_lines.push_back({"unigram entropy", entropy});
    std::vector<zest::report::series> curves{loss};
    if (!aux.x.empty()) {
      curves.push_back(aux);
      po.y2_label = "aux loss";
    }
    zest::write_text_file_atomically(f.plot, zest::report::svg_line_plot(curves, po));
  }
}

// ---------------------------------------------------------------------------------------
// Checks before any work (declared in train_gpt.hpp).

namespace {

using detail::fail;

// An output `path` (a file, or with `folder` a checkpoint folder) that can be written: not
// an existing entry of the other kind, and its nearest existing ancestor a folder this
// process may create entries in (missing folders are created when written).
void check_writable(std::string_view option, const std::filesystem::path& path, bool folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  const std::string named = std::string(option) + " " + path.string();
  if (fs::exists(st)) {
    if (folder && !fs::is_directory(st)) fail(named + ": it exists and is not a folder");
    if (!folder && fs::is_directory(st)) fail(named + ": it is a folder, not a file");
    if (folder) {
      if (::access(path.c_str(), W_OK | X_OK) != 0)
        fail(named + ": the folder is not writable (" + std::strerror(errno) + ")");
      return;
    }
  }
  fs::path up = fs::absolute(path, ec).parent_path();
  while (!up.empty() && !fs::exists(fs::status(up, ec)) && up != up.root_path())
    up = up.parent_path();
  if (!fs::is_directory(fs::status(up, ec)))
    fail(named + ": " + up.string() + " is not a folder, so the " + (folder ? "folder" : "file") +
         " cannot be created");
  if (::access(up.c_str(), W_OK | X_OK) != 0)
    fail(named + ": cannot create entries in " + up.string() + " (" + std::strerror(errno) + ")");
}

// `p` as the file system resolves it: absolute, with `.`, `..` and the links of the part that
// exists resolved (so that two spellings of one place compare equal).
std::filesystem::path resolved(const std::filesystem::path& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) r = fs::absolute(p).lexically_normal();
  if (!r.has_filename() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
  return r;
}
// Whether `inner` is `outer` or lies inside it (both resolved).
bool within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  const auto rel = inner.lexically_relative(outer);
  return !rel.empty() && *rel.begin() != "..";
}

// The outputs against each other and against what the run reads: --log, --plot and --save
// each name their own place; the save folder holds the checkpoint's files only (a save
// rewrites its manifest and removes the previous step's shards), and so does the --load
// folder; nothing is written into the corpus. A collision is refused before any work.
void check_output_paths(const flags& f) {
  namespace fs = std::filesystem;
  struct place {
    std::string option, path;
    bool folder;
    fs::path at;
  };
  std::vector<place> outputs;
  const auto add = [&](const char* option, const std::string& path, bool folder) {
    if (!path.empty()) outputs.push_back({option, path, folder, resolved(path)});
  };
  add("--log", f.log, false);
  add("--plot", f.plot, false);
  add("--save", f.save, true);
  add("--export", f.export_to, f.export_to.ends_with('/'));
  const auto named = [](const place& p) { return p.option + " " + p.path; };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = 0; j < outputs.size(); ++j) {
      const place &a = outputs[i], &b = outputs[j];
      if (i < j && a.at == b.at)
        fail(named(a) + " and " + named(b) + " are the same path: each output needs its own");
      if (i != j && b.folder && a.at != b.at && within(a.at, b.at))
        fail(named(a) + " is inside the " + b.option + " folder " + b.path +
             ", which holds the checkpoint's files only (each save rewrites its manifest and "
             "removes the previous step's shards): write it elsewhere");
    }
  }
  if (!f.load.empty()) {
    const fs::path load = resolved(f.load);
    for (const place& o : outputs) {
      if (!o.folder && within(o.at, load))
        fail(named(o) + " is inside the --load checkpoint " + f.load +
             ", whose files the run reads: write it elsewhere");
    }
  }
  const std::string corpus =
      f.corpus.empty() ? std::string(zest::text_dataset::default_corpus) : f.corpus;
  const fs::path source = resolved(corpus);
  for (const place& o : outputs) {
    if (within(o.at, source))
      fail(named(o) + (o.at == source ? " is" : " is inside") + " the corpus " + corpus +
           ", which the run reads: write it elsewhere");
  }
}

// Creates the folders of `dir` that are missing, remembering them (innermost last).
std::vector<std::filesystem::path> create_missing(const std::filesystem::path& dir,
                                                  const std::string& named) {
  namespace fs = std::filesystem;
  std::vector<fs::path> created;
  std::error_code ec;
  for (fs::path up = dir; !up.empty() && !fs::exists(fs::symlink_status(up, ec));
       up = up.parent_path()) {
    created.insert(created.begin(), up);
    if (up == up.root_path()) break;
  }
  for (const fs::path& d : created) {
    if (!fs::create_directory(d, ec) && ec) {
      const std::string why = ec.message();
      for (auto it = created.rbegin(); it != created.rend(); ++it) fs::remove(*it, ec);
      fail(named + ": cannot create the folder " + d.string() + " (" + why + ")");
    }
  }
  return created;
}

// The run's outputs written for real, once, before any work (rank 0, whose verdict every rank
// takes): in each output's folder a file is created and removed, as the atomic writes and the
// checkpoint's shards will (a file next to the target, renamed over it), and the folders
// that this creates are removed again. Catches what permission bits do not show (a read-only
// or full file system, /proc, a root-owned path under root). With --load, an existing --log
// must be a training log: the resumed run continues it.
void probe_outputs(const flags& f) {
  namespace fs = std::filesystem;
  if (!f.log.empty() && !f.load.empty()) {
    std::error_code ec;
    if (fs::exists(f.log, ec)) {
      try {
        (void)zest::report::training_log::read(f.log);
      } catch (const std::exception& e) {
        fail("--log " + f.log +
             ": the file exists and is not a training log that this run could continue (a "
             "run with --load appends its steps to the log it names): " +
             e.what() + "; name the run's own log or a new file");
      }
    }
  }
  const auto probe = [](const std::string& option, const std::string& path, bool folder) {
    const std::string named = option + " " + path;
    const fs::path dir = folder ? fs::absolute(path) : fs::absolute(path).parent_path();
    const auto created = create_missing(dir, named);
    const fs::path trial = dir / (".train_gpt-check-" + std::to_string(::getpid()));
    const int fd = ::open(trial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    const int error = errno;
    bool written = false;
    if (fd >= 0) {
      written = ::write(fd, "x", 1) == 1;
      ::close(fd);
      ::unlink(trial.c_str());
    }
    std::error_code ec;
    for (auto it = created.rbegin(); it != created.rend(); ++it) fs::remove(*it, ec);
    if (fd < 0)
      fail(named + ": cannot create a file in " + dir.string() + " (" + std::strerror(error) + ")");
    if (!written) fail(named + ": cannot write a file in " + dir.string());
  };
  if (!f.log.empty()) probe("--log", f.log, false);
  if (!f.plot.empty()) probe("--plot", f.plot, false);
  if (!f.save.empty()) probe("--save", f.save, true);
  if (!f.export_to.empty()) probe("--export", f.export_to, f.export_to.ends_with('/'));
}

// The machine's memory: the smaller of its RAM and the cgroup's limit, if any.
double machine_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  double bytes = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page)
                                       : std::numeric_limits<double>::infinity();
  for (const char* limit :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(limit);
    double v = 0;
    if (in >> v && v > 0) bytes = std::min(bytes, v);
  }
  return bytes;
}

}  // namespace

// "1 rank", "4 ranks" (`what` between: "1 data-parallel rank").
std::string ranks_text(int n, const std::string& what = "") {
  return std::to_string(n) + " " + (what.empty() ? "" : what + " ") + (n == 1 ? "rank" : "ranks");
}

void check_run(const flags& f, int world, int ranks_here) {
  if (f.width % f.heads != 0)
    fail("--width " + std::to_string(f.width) + " is not a multiple of --heads " +
         std::to_string(f.heads));
  if (f.min_lr > f.lr)
    fail("--min-lr " + zest::report::format_number(f.min_lr, 6) + " exceeds --lr " +
         zest::report::format_number(f.lr, 6));
  if (f.schedule_steps > 0 && f.warmup > f.schedule_steps && f.was_given("--warmup"))
    fail("--warmup " + std::to_string(f.warmup) + " exceeds --schedule-steps " +
         std::to_string(f.schedule_steps));
  if (f.new_schedule && f.load.empty()) fail("--new-schedule applies to runs with --load");
  if (f.save.empty()) {
    for (const char* o : {"--save-every", "--async-save"})
      if (f.was_given(o)) fail(std::string(o) + " applies to runs with --save");
  }
  if (f.new_data && f.load.empty()) fail("--new-data applies to runs with --load");
  if (!f.init_from.empty() && !f.load.empty())
    fail(
        "--init-from and --load exclude each other: --load resumes a run (weights, Adam's "
        "moments, the step), --init-from starts one from weights");
  if (!f.init_from.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(f.init_from, ec))
      fail("--init-from " + f.init_from + ": no such file or folder");
  }
  if (f.was_given("--loss-scale") && f.precision != "fp16")
    fail("--loss-scale applies to --precision fp16 (this run is " + f.precision + ")");
  if (f.device == "cuda" && f.precision == "fp16")
    fail("--device cuda trains in fp32 or bf16 (--precision fp16 runs on the CPU)");
  if (f.arch == "gpt") {
    for (const char* o : {"--kv-heads", "--hidden", "--tie-head", "--rope-base"})
      if (f.was_given(o)) fail(std::string(o) + " applies to --arch llama only");
  } else {
    if (f.moe) fail("--moe applies to --arch gpt (the llama decoder has no expert layers)");
    if (f.device == "cuda") fail("--arch llama trains on the CPU (--device cpu)");
    if (f.kv_heads != 0 && f.heads % f.kv_heads != 0)
      fail("--kv-heads " + std::to_string(f.kv_heads) + " does not divide --heads " +
           std::to_string(f.heads));
    if (f.width % f.heads == 0 && (f.width / f.heads) % 2 != 0)
      fail("--arch llama: the head dim --width " + std::to_string(f.width) + " / --heads " +
           std::to_string(f.heads) + " = " + std::to_string(f.width / f.heads) +
           " is odd; RoPE rotates pairs of dims");
  }
  if (!f.moe) {
    for (const char* o : {"--experts", "--top-k", "--capacity-factor", "--aux-weight", "--ep",
                          "--moe-capacity", "--moe-dropless", "--bias-update-rate"})
      if (f.was_given(o)) fail(std::string(o) + " applies to --moe runs only");
  } else if (f.moe_capacity && f.moe_dropless) {
    fail("--moe-capacity and --moe-dropless exclude each other");
  } else if (f.moe_dropless && f.was_given("--capacity-factor")) {
    fail("--capacity-factor applies to --moe-capacity runs (--moe-dropless has no capacity)");
  } else if (f.recompute == "full") {
    fail(
        "--recompute full applies to dense blocks: an expert layer's aux loss leaves its "
        "block (use --recompute selective with --moe)");
  } else if (f.layers < 2) {
    fail(
        "--moe: the expert layers are every second block (blocks 1, 3, 5, ... counting from "
        "0), so --layers " +
        std::to_string(f.layers) + " has none; give --layers 2 or more");
  } else if (f.experts < static_cast<std::size_t>(f.top_k)) {
    fail("--experts " + std::to_string(f.experts) + " is fewer than --top-k " +
         std::to_string(f.top_k));
  }
  check_output_paths(f);
  if (!f.log.empty()) check_writable("--log", f.log, false);
  if (!f.plot.empty()) check_writable("--plot", f.plot, false);
  if (!f.save.empty()) check_writable("--save", f.save, true);
  if (!f.export_to.empty()) check_writable("--export", f.export_to, f.export_to.ends_with('/'));
  if (f.tp > 1 && f.device == "cuda") fail("--tp applies to --device cpu");
  if (f.sp > 1 && f.device == "cuda") fail("--sp applies to --device cpu");
  if (world % f.tp != 0)
    fail("--tp " + std::to_string(f.tp) + " does not divide the " + ranks_text(world));
  if ((world / f.tp) % f.sp != 0)
    fail("--sp " + std::to_string(f.sp) + " does not divide the " + ranks_text(world / f.tp) +
         " that --tp " + std::to_string(f.tp) + " leaves");
  const int data_ranks = world / (f.tp * f.sp);
  if (f.ep > 0 && data_ranks % f.ep != 0)
    fail("--ep " + std::to_string(f.ep) + " does not divide the " + ranks_text(data_ranks) +
         " that --tp and --sp leave");
  if (f.moe && f.ep > 0 && f.experts % static_cast<std::size_t>(f.ep) != 0)
    fail("--ep " + std::to_string(f.ep) + " does not divide --experts " +
         std::to_string(f.experts));
  if (!f.zeropp.empty()) {
    if (f.zero != 3)
      fail("--zeropp builds on ZeRO-3's partitioned parameters (this run asks --zero " +
           std::to_string(f.zero) + ")");
    if (f.precision != "fp32" || f.arch != "gpt" || f.device != "cpu")
      fail("--zeropp trains the fp32 GPT on the CPU (this run asks --precision " + f.precision +
           ", --arch " + f.arch + ", --device " + f.device + ")");
    if (f.was_given("--hsdp"))
      fail(
          "--hsdp replicates the states across the nodes and --zeropp partitions them across "
          "(--nodes N): choose one");
  } else if (f.was_given("--nodes")) {
    fail("--nodes applies to --zeropp runs (hybrid sharding's nodes are --hsdp N)");
  }
  flags one_node = f;
  one_node.hsdp = one_node.nodes = 1;
  const int dp_ranks = mesh_sizes(one_node, world)[1];
  const int nodes = f.zeropp.empty() ? f.hsdp : f.nodes;
  if (dp_ranks % nodes != 0)
    fail((f.zeropp.empty() ? "--hsdp " : "--nodes ") + std::to_string(nodes) +
         " does not divide the " + ranks_text(dp_ranks, "data-parallel") +
         " that --tp, --sp and --ep leave");
  check_memory(f, mesh_sizes(f, world), ranks_here);
}

mesh_sizes_t mesh_sizes(const flags& f, int world) {
  const int data = world / (f.tp * f.sp);  // node x dp x ep
  int ep = f.ep;
  if (ep == 0) {
    ep = 1;
    if (f.moe) {
      for (int d = 1; d <= data; ++d) {
        if (data % d == 0 && f.experts % static_cast<std::size_t>(d) == 0) ep = d;
      }
    }
  }
  const int nodes = f.zeropp.empty() ? f.hsdp : f.nodes;
  return {nodes, data / ep / nodes, ep, f.tp, f.sp};
}

memory_need estimate_memory(const flags& given, mesh_sizes_t sizes) {
  memory_need m;
  flags f = given;
  resolve_arch(f);  // llama: the kv heads and hidden width the model will have
  // Rank 0: the one that holds the most. The planner plans its blocks over tp and ep (the
  // model's shape for them: zest::gpt_shape, llama_shape) under ZeRO over dp, replicated
  // over node.
  const zest::mesh_shape<"node", "dp", "ep"> mesh(std::array<int, 3>{sizes[0], sizes[1], sizes[2]});
  const auto tp_ranks = static_cast<std::size_t>(sizes[3]);
  const zest::training_precision& precision =
      f.precision == "fp32" ? zest::fp32_adam : zest::mixed_precision_adam;
  // The planner's figure is a sum over parameters, and the blocks are alike but for the
  // expert layers (blocks 1, 3, 5, ...): plan one, two and three blocks, and take the model
  // of `layers` blocks from them (the largest byte vocabulary, 256, stands for the corpus's,
  // not read yet).
  const auto plan_of = [&](std::size_t layers) {
    flags g = f;
    g.layers = layers;
    zest::model_shape shape = f.arch == "llama"
                                  ? llama_example::llama_shape(llama_options_of(g, 256), tp_ranks)
                                  : zest::gpt_shape(gpt_arch::options(g, 256), tp_ranks,
                                                    static_cast<std::size_t>(sizes[2]));
    // ZeRO splits an expert parameter on its second dim (the layer's split_dim_named: its
    // first, the experts, is split over ep), where the planner splits the first: swap them.
    for (auto& p : shape.parameters) {
      if (p.name.find(".moe.experts.") != std::string::npos) std::swap(p.extents[0], p.extents[1]);
    }
    if (!f.zeropp.empty()) {  // hpZ's secondary copies count with the states they copy
      const zest::zero_plan p = zest::plan_zero<zeropp_stage>(shape, mesh, precision);
      return static_cast<double>(p.memory.total() + p.secondary_bytes);
    }
    return static_cast<double>(
        zest::plan_zero<"dp", zest::split_first_dim, "node">(f.zero, shape, mesh, precision)
            .memory.total());
  };
  const double one = plan_of(1), two = plan_of(2), three = plan_of(3);
  const double dense_block = three - two, odd_block = two - one;  // odd: an expert layer
  const double layers = static_cast<double>(f.layers);
  m.model_states =
      one - dense_block + std::ceil(layers / 2) * dense_block + std::floor(layers / 2) * odd_block;
  const double w = static_cast<double>(f.width);
  const double hidden = 4 * w;
  const double moe_layers = f.moe ? std::floor(layers / 2) : 0;
  // Activations: what the tape keeps per token and block (the widths listed below) and the
  // attention's scores and weights (2 heads x context), the logits and their softmax (3 x
  // vocab), in fp32, and as much again for their gradients in backward. A rank holds its share of the batch (dp x ep) and of the
  // sequence over sp and tp: the stream is split along the sequence over both, and inside
  // the regions that gather it, tp splits the features (heads, the MLP's hidden layer, the
  // vocabulary) and Ulysses' all-to-alls give sp a share of the heads.
  const double tokens = std::ceil(static_cast<double>(f.batch) / (sizes[0] * sizes[1] * sizes[2])) *
                        std::ceil(static_cast<double>(f.context) / (sizes[3] * sizes[4]));
  // Per block, GPT: the block's input, the normalised inputs, the attention's projection,
  // the residual sums and the MLP's hidden layer before and after GELU (12 widths), and q,
  // k, v and the attention output (4 widths). llama: the block's input, the projection and
  // the residual sum (2 widths), the SwiGLU's gate, up, silu and product (4 hidden widths),
  // and q, k, v, their rotations and the attention output (6 widths). Two widths, the
  // normalised inputs of the attention and of the MLP, are kept as tp gathered them: the
  // whole sequence on every rank of tp. The attention's widths and scores are per head: a
  // rank holds ceil(ceil(heads / tp) / sp) of them (llama: of the kv heads, with their
  // groups; Ulysses splits the heads over sp inside tp), more than its share where tp and
  // sp do not divide them.
  const double tp = sizes[3];
  const bool llama = f.arch == "llama";
  const double heads = static_cast<double>(llama ? f.kv_heads : f.heads);
  const double sp = sizes[4];
  const double head_share = std::ceil(std::ceil(heads / tp) / sp) * tp * sp / heads;
  const double per_block_widths = (llama ? 2 * w + 4 * static_cast<double>(f.hidden) : 12 * w) +
                                  (llama ? 6 : 4) * w * head_share + 2 * w * tp;
  const double per_block_scores =
      2 * static_cast<double>(f.heads) * static_cast<double>(f.context) * head_share;
  // An expert layer's router probabilities, its dispatched and combined tokens and its
  // experts' hidden activations: the layer sees the whole sequence on every rank of tp and
  // sp.
  const double routed = static_cast<double>(f.top_k) * (f.moe_dropless ? 1.0 : f.capacity_factor);
  const double moe_per_block =
      f.moe ? (static_cast<double>(f.experts) + 2 * w * routed + 2 * hidden * routed) * tp *
                  static_cast<double>(sizes[4])
            : 0.0;
  // Recomputation: selective keeps the blocks' values but not their scores, which backward
  // rebuilds one block at a time; full keeps each block's input only and rebuilds one whole
  // block at a time.
  double per_token = 3 * 256 + w * tp;  // the logits and the final norm's gathered output
  if (f.recompute == "full") {
    per_token += layers * w + per_block_widths + per_block_scores + moe_per_block;
  } else if (f.recompute == "selective") {
    per_token += layers * per_block_widths + moe_layers * moe_per_block + per_block_scores;
  } else {
    per_token += layers * (per_block_widths + per_block_scores) + moe_layers * moe_per_block;
  }
  m.activations = 2 * 4 * tokens * per_token;
  // Every parameter tensor's bookkeeping (names, shards, Adam state, buffers): about 1 KiB.
  m.bookkeeping = 1024.0 * (5 + 12 * layers);
  return m;
}

void check_memory(const flags& f, mesh_sizes_t sizes, int ranks_here) {
  const memory_need m = estimate_memory(f, sizes);
  const double available = machine_memory_bytes();
  const double need = m.total() * ranks_here;
  if (need <= available) return;
  using zest::report::format_bytes;
  std::string culprit;
  if (m.model_states >= m.activations && m.model_states >= m.bookkeeping) {
    culprit = "model states (--width " + std::to_string(f.width) + ", --layers " +
              std::to_string(f.layers) +
              (f.moe ? ", --experts " + std::to_string(f.experts) : std::string()) + ")";
  } else if (m.activations >= m.bookkeeping) {
    culprit = "activations (--batch " + std::to_string(f.batch) + ", --context " +
              std::to_string(f.context) + ", --width " + std::to_string(f.width) + ", --layers " +
              std::to_string(f.layers) + ")";
  } else {
    culprit = "the parameters' bookkeeping (--layers " + std::to_string(f.layers) + ")";
  }
  fail("this run needs about " + format_bytes(m.total()) + " per rank (model states " +
       format_bytes(m.model_states) + " by the ZeRO-" + std::to_string(f.zero) +
       " planner, activations " + format_bytes(m.activations) + ", bookkeeping " +
       format_bytes(m.bookkeeping) + "), " + format_bytes(need) + " for the " +
       std::to_string(ranks_here) + (ranks_here == 1 ? " rank" : " ranks") +
       " on this machine, more than its " + format_bytes(available) + " of memory; the most is " +
       culprit);
}

namespace {
// The shortest text that reads back as v (0.003, not 0.0030000000000000001).
std::string shortest_text(double v) {
  char buf[64];
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

// A resumed run's model settings that no tensor's shape shows must be the checkpoint's
// (`config`: its metadata config, or nullptr): the architecture, and RoPE's base, which is
// taken from the checkpoint when not given.
void check_resumed_model(flags& f, const zest::json::value* config) {
  if (config == nullptr || !config->is_object()) return;
  const zest::json::value* arch = config->find("arch");
  const std::string saved = arch != nullptr && arch->is_string() ? arch->as_string() : "gpt";
  if (saved != f.arch)
    fail("--load " + f.load + ": the checkpoint holds an --arch " + saved +
         " model, and this run is --arch " + f.arch);
  const zest::json::value* base = config->find("rope_base");
  if (base == nullptr || !base->is_number()) return;
  if (!f.was_given("--rope-base")) {
    f.rope_base = base->as_number();
  } else if (f.rope_base != base->as_number()) {
    fail("--rope-base " + shortest_text(f.rope_base) + " differs from checkpoint " + f.load +
         "'s (--rope-base " + shortest_text(base->as_number()) +
         "): RoPE's base is part of the model; leave the option out to continue with it");
  }
}
}  // namespace

void resolve_arch(flags& f) {
  if (f.arch != "llama") return;
  if (f.kv_heads == 0) f.kv_heads = f.heads;
  if (f.hidden == 0) f.hidden = llama_example::default_hidden(f.width);
}

void resolve_schedule(flags& f, const zest::json::value* saved, bool root) {
  if (f.schedule_steps == 0) f.schedule_steps = std::max<std::int64_t>(f.steps, 1);
  if (saved == nullptr || !saved->is_object()) return;
  const zest::warmup_cosine before = {
      (*saved)["peak_lr"].as_number(), (*saved)["min_lr"].as_number(),
      (*saved)["warmup_steps"].as_int(), (*saved)["total_steps"].as_int()};
  struct field {
    const char* option;
    std::string saved_text, given_text;
    bool differs;
    std::function<void()> take_saved;
  };
  const auto text = [](double v) { return shortest_text(v); };
  // The checkpoint's warmup is already clamped to its length; so is this run's.
  const std::int64_t warmup_now = std::min(f.warmup, f.schedule_steps);
  std::vector<field> fields = {
      {"--lr", text(before.peak_lr), text(f.lr), f.lr != before.peak_lr,
       [&] { f.lr = before.peak_lr; }},
      {"--min-lr", text(before.min_lr), text(f.min_lr), f.min_lr != before.min_lr,
       [&] { f.min_lr = before.min_lr; }},
      {"--schedule-steps", std::to_string(before.total_steps), std::to_string(f.schedule_steps),
       f.schedule_steps != before.total_steps, [&] { f.schedule_steps = before.total_steps; }},
      {"--warmup", std::to_string(before.warmup_steps), std::to_string(f.warmup),
       warmup_now != before.warmup_steps, [&] { f.warmup = before.warmup_steps; }},
  };
  std::string changed;
  for (auto& x : fields) {
    if (!f.was_given(x.option)) {
      x.take_saved();
    } else if (x.differs) {
      if (!f.new_schedule)
        fail(std::string(x.option) + " " + x.given_text +
             " differs from the learning-rate schedule of checkpoint " + f.load + " (" + x.option +
             " " + x.saved_text +
             "); a resumed run continues its checkpoint's schedule: leave the option out, or "
             "add --new-schedule to follow the new value");
      changed += std::string(changed.empty() ? "" : ", ") + x.option + " " + x.saved_text + " -> " +
                 x.given_text;
    }
  }
  if (root && !changed.empty())
    std::cout << "note: --new-schedule: the learning-rate schedule of " << f.load
              << " changes: " << changed << '\n';
}
}  // namespace train_gpt_example

#if !defined(ZEST_TRAIN_GPT_CUDA)
// This build has no CUDA (ZEST_CUDA=OFF, or no nvcc/NCCL found): --device cuda says so.
int train_gpt_example::train_on_cuda(const flags&, const zest::text_dataset&, mesh_sizes_t) {
  throw std::invalid_argument(
      "train_gpt: --device cuda: this build has no CUDA backend; configure with "
      "-DZEST_CUDA=ON on a machine with the CUDA toolkit and NCCL (scripts/gpu-check does)");
}
#endif

int main(int argc, char** argv) {
  using namespace train_gpt_example;
  zest::mpi_environment mpi(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    const auto parsed = parse(argc, argv);
    if (!parsed) {
      if (rank == 0) std::cout << usage();
      return 0;
    }
    flags f = *parsed;
    // Before any mesh or collective of zest's.
    if (f.checked) zest::set_checked_mode(true);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    // The ranks on this machine (they share its memory).
    MPI_Comm here = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &here);
    int ranks_here = 1;
    MPI_Comm_size(here, &ranks_here);
    MPI_Comm_free(&here);
    // Everything that can be checked before the work: the options, the outputs, the memory,
    // and the checkpoint's manifest and schedule.
    check_run(f, world, ranks_here);
    {
      // Rank 0 writes the outputs for a trial; every rank takes its verdict, so that all of
      // them stop together (exit status 1) when an output cannot be written.
      std::string why;
      if (rank == 0) {
        try {
          probe_outputs(f);
        } catch (const std::exception& e) {
          why = e.what();
        }
      }
      int length = static_cast<int>(why.size());
      MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
      why.resize(static_cast<std::size_t>(length));
      MPI_Bcast(why.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
      if (!why.empty()) throw std::invalid_argument(why);
    }
    resolve_arch(f);
    std::optional<zest::io::checkpoint_info> resumed;
    if (!f.load.empty()) resumed = zest::io::read_checkpoint_info(f.load);
    const zest::json::value* saved_schedule = nullptr;
    if (resumed && resumed->metadata.is_object()) {
      if (const auto* config = resumed->metadata.find("config"))
        saved_schedule = config->find("schedule");
    }
    resolve_schedule(f, saved_schedule, rank == 0);
    if (resumed && resumed->metadata.is_object())
      check_resumed_model(f, resumed->metadata.find("config"));
    const mesh_sizes_t sizes = mesh_sizes(f, world);
    const auto data = f.corpus.empty() ? zest::text_dataset::from_path()
                                       : zest::text_dataset::from_path(f.corpus);
    if (f.device == "cuda") return train_on_cuda(f, data, sizes);
    if (f.arch == "llama") return train_on<cpu_mesh, llama_arch, zest::float16>(f, data, sizes);
    return train_on<cpu_mesh, gpt_arch, zest::float16>(f, data, sizes);
  } catch (const std::exception& e) {
    // An error that only this rank saw (a bad token id in its shard, a full disk) would
    // leave the others waiting in a collective: take the whole job down, but only once
    // every rank's message is out (zest/comm/mpi_environment.hpp).
    zest::report_and_abort(e);
  }
}
