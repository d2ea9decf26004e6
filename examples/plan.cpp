// plan — per-GPU memory and step time of transformer training under dp x tp x ep, with a ZeRO
// stage over dp, sequence parallelism and activation recomputation (zest/zero/planner.hpp,
// zest/zero/transformer_plan.hpp, zest/zero/cost_model.hpp). One process, no MPI, any size:
//
//   build/default/examples/plan                       # the published setups, checked
//   build/default/examples/plan --params 175B --ranks 1024 --stage 3
//   build/default/examples/plan --layers 32 --hidden 4096 --heads 32 --seq 4096 --dp 16 --tp 8
//                               --zero 1 --sp --recompute selective
//   build/default/examples/plan --help
//
// Figures are for the GPU at coordinate 0 of every axis (with balanced blocks it holds the
// most), in decimal units as in the ZeRO paper (1 GB = 1e9 bytes). The exit status is 1 when a
// figure of the ZeRO paper's example or a published model's size does not come out as printed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "zest/backend/host/blas.hpp"
#include "zest/mesh/mesh_shape.hpp"
#include "zest/zero/cost_model.hpp"
#include "zest/zero/planner.hpp"
#include "zest/zero/stage.hpp"
#include "zest/zero/transformer_plan.hpp"

namespace {

struct options {
  // The flat ZeRO model (--params, --ranks).
  std::optional<std::uint64_t> params;
  std::optional<int> ranks;
  std::optional<int> stage;
  bool fp32 = false;
  // A transformer of one's own (any of these flags).
  bool transformer = false;
  zest::transformer_config model = zest::gpt_transformer("GPT-2 small", 12, 768, 12, 50257, 1024);
  zest::parallel_layout layout{};
  bool untied = false;
  // The cluster.
  zest::cluster cluster = zest::dgx2_v100_cluster();
  bool measured_cluster = false;  // --cluster this-machine: measured before planning
  bool overlap = false;
  bool measure_flops = false;
};

constexpr std::string_view usage =
    "usage: plan [options]\n"
    "\n"
    "Without options: the published setups, each with the planner's figures next to the\n"
    "paper's: the ZeRO paper's table (7.5B, N_d = 64, checked), Turing-NLG (17B, TP 4 x DP 64,\n"
    "ZeRO-1), the ZeRO paper's 100B model on 400 V100, GShard's MoE from 128 to 2048 experts.\n"
    "\n"
    "ZeRO on one flat parameter (the ZeRO paper's model):\n"
    "  --params N          N elements (suffixes k, M, B, T: 7.5B, 175B)\n"
    "  --ranks N           data-parallel ranks N_d (default 64)\n"
    "  --stage K           only stage K (0-3), with the plan's phases in detail\n"
    "  --fp32              fp32 parameters and gradients (K = 8) instead of bf16/fp16 (K = 12)\n"
    "\n"
    "A transformer (any of these flags; defaults: GPT-2 small on one GPU):\n"
    "  --arch A            gpt (LayerNorm, biases, learned positions, GELU, tied head) or\n"
    "                      llama (RMSNorm, no biases, rotary, SwiGLU, untied, no dropout)\n"
    "  --layers N --hidden N --heads N --vocab N --seq N\n"
    "  --kv-heads N        key/value heads (grouped-query attention), dividing --heads\n"
    "  --ffn N             MLP hidden width (default 4 x hidden; llama: give it)\n"
    "  --untied            the head has its own weights (gpt)\n"
    "  --no-dropout        no dropout masks kept\n"
    "  --batch N           micro-batch: sequences per data rank (of dp x ep) (default 1)\n"
    "  --accumulation N    micro-batches per optimizer step (default 1)\n"
    "  --dp N --tp N --ep N  the layout: dp x tp x ep GPUs (default 1 each)\n"
    "  --zero K            ZeRO stage over dp, 0-3 (default 0; --stage is the same)\n"
    "  --sp                sequence parallelism over tp (needs --tp >= 2)\n"
    "  --recompute R       none, selective (attention scores) or full (per layer)\n"
    "  --experts N         expert layers with N experts (--ep divides N)\n"
    "  --top-k K           experts per token (default 2)\n"
    "  --moe-every N       every N-th layer has experts (default 2)\n"
    "  --capacity-factor X slots per expert, times k tokens / E (default 1)\n"
    "\n"
    "The time model (see zest/zero/cost_model.hpp):\n"
    "  --cluster C         dgx2-v100 (the default), dgx-a100, or this-machine: its sgemm,\n"
    "                      the model's own products and its memory bandwidth measured now,\n"
    "                      the links MPI's between processes here (figures below override)\n"
    "  --peak-tflops X     per-device peak (default 125; --peak-gflops X the same in GFLOP/s)\n"
    "  --efficiency X      share of the peak the compute reaches, in (0, 1] (default 0.4)\n"
    "  --dp-gbps X --tp-gbps X --ep-gbps X     link bandwidth per GPU, GB/s\n"
    "  --dp-latency-us X --tp-latency-us X --ep-latency-us X   per message step\n"
    "  --memory-gbps X     memory bandwidth for the activations' traffic, GB/s (default:\n"
    "                      not modelled; a CPU's element-wise work is not hidden by GEMMs)\n"
    "  --activation-passes X  times each activation byte is moved per step (default 3)\n"
    "  --overlap           communication hidden behind compute (default: none)\n"
    "  --measure-flops     measure this machine's single-thread sgemm (n = 1024) and exit;\n"
    "                      with model flags also that model's products per rank and the\n"
    "                      memory bandwidth, printed as the flags above\n";

std::string fixed(double v, int digits);

// "7.5B" -> 7.5e9
double parse_amount(std::string_view text) {
  std::string s(text);
  double scale = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'k':
      case 'K': scale = 1e3; break;
      case 'M': scale = 1e6; break;
      case 'B':
      case 'G': scale = 1e9; break;
      case 'T': scale = 1e12; break;
      default: break;
    }
    if (scale != 1) s.pop_back();
  }
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || !(v > 0) || !std::isfinite(v * scale))
    throw std::invalid_argument("not a positive count: '" + std::string(text) + "'");
  return v * scale;
}

std::uint64_t parse_count(std::string_view text) {
  return static_cast<std::uint64_t>(std::llround(parse_amount(text)));
}

// A positive whole number no larger than `limit`, for `flag`.
std::uint64_t parse_whole(std::string_view flag, std::string_view text, std::uint64_t limit) {
  double v = 0;
  try {
    v = parse_amount(text);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument(std::string(flag) + ": not a positive whole number: '" +
                                std::string(text) + "'");
  }
  if (v != std::floor(v))
    throw std::invalid_argument(std::string(flag) + ": '" + std::string(text) +
                                "' is not a whole number");
  if (v > static_cast<double>(limit))
    throw std::invalid_argument(std::string(flag) + ": " + std::string(text) + " exceeds " +
                                std::to_string(limit));
  return static_cast<std::uint64_t>(v);
}

// A positive real number (with `at_most`, in (0, at_most]).
double parse_real(std::string_view flag, std::string_view text, double at_most = 0) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(std::string(text), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(v > 0) || !std::isfinite(v))
    throw std::invalid_argument(std::string(flag) + ": not a positive number: '" +
                                std::string(text) + "'");
  if (at_most > 0 && v > at_most)
    throw std::invalid_argument(std::string(flag) + ": " + std::string(text) + " exceeds " +
                                fixed(at_most, 2));
  return v;
}

// This machine as bench/README.md's "Planner calibration" measured it: MPI between two
// processes (busbw of the median sample), 2 us per message step, and the element-wise work
// per activation byte fit there; the FLOP rates and the memory bandwidth are measured when
// the plan runs (main).
constexpr double this_machine_link_gbps = 1.6;
constexpr double this_machine_activation_passes = 6;

zest::cluster this_machine_cluster() {
  zest::cluster c;
  c.name = "this machine";
  c.data = {this_machine_link_gbps * 1e9, 2e-6};
  c.tensor = c.data;
  c.expert = c.data;
  c.activation_passes = this_machine_activation_passes;
  return c;
}

options parse(int argc, char** argv) {
  options o;
  bool arch_llama = false;
  std::optional<std::size_t> ffn;
  constexpr std::uint64_t extent_limit = std::uint64_t{1} << 32;
  constexpr std::uint64_t ranks_limit = 1'000'000'000ULL;
  // The named cluster first, so that the figures given beside it override its own.
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string_view(argv[i]) != "--cluster") continue;
    const std::string_view v = argv[i + 1];
    if (v == "dgx2-v100") o.cluster = zest::dgx2_v100_cluster();
    else if (v == "dgx-a100") o.cluster = zest::dgx_a100_cluster();
    else if (v == "this-machine") o.cluster = this_machine_cluster(), o.measured_cluster = true;
    else
      throw std::invalid_argument("--cluster: dgx2-v100, dgx-a100 or this-machine, not '" +
                                  std::string(v) + "'");
  }
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(a) + " needs a value");
      return argv[++i];
    };
    auto extent = [&](std::size_t& field) {
      field = static_cast<std::size_t>(parse_whole(a, value(), extent_limit));
      o.transformer = true;
    };
    auto ranks = [&](int& field) {
      field = static_cast<int>(parse_whole(a, value(), ranks_limit));
      o.transformer = true;
    };
    auto gbps = [&](zest::axis_link& l) { l.bandwidth = parse_real(a, value()) * 1e9; };
    auto latency = [&](zest::axis_link& l) { l.latency = parse_real(a, value()) * 1e-6; };
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      std::exit(0);
    } else if (a == "--params") {
      o.params = parse_count(value());
    } else if (a == "--ranks") {
      o.ranks = static_cast<int>(parse_whole(a, value(), ranks_limit));
    } else if (a == "--stage" || a == "--zero") {
      const std::string_view v = value();
      if (v.size() != 1 || v[0] < '0' || v[0] > '3')
        throw std::invalid_argument(std::string(a) + ": ZeRO has stages 0-3, not '" +
                                    std::string(v) + "'");
      o.stage = v[0] - '0';
      o.layout.zero_stage = *o.stage;
    } else if (a == "--fp32") {
      o.fp32 = true;
    } else if (a == "--arch") {
      const std::string_view v = value();
      if (v != "gpt" && v != "llama")
        throw std::invalid_argument("--arch: gpt or llama, not '" + std::string(v) + "'");
      arch_llama = v == "llama";
      o.transformer = true;
    } else if (a == "--layers") {
      extent(o.model.layers);
    } else if (a == "--hidden") {
      extent(o.model.hidden);
    } else if (a == "--heads") {
      extent(o.model.heads);
    } else if (a == "--kv-heads") {
      extent(o.model.kv_heads);
    } else if (a == "--ffn") {
      std::size_t f = 0;
      extent(f);
      ffn = f;
    } else if (a == "--vocab") {
      extent(o.model.vocab);
    } else if (a == "--seq") {
      extent(o.model.sequence);
    } else if (a == "--batch") {
      extent(o.layout.micro_batch);
    } else if (a == "--accumulation") {
      extent(o.layout.accumulation);
    } else if (a == "--untied") {
      o.untied = true;
      o.transformer = true;
    } else if (a == "--no-dropout") {
      o.model.dropout = false;
      o.transformer = true;
    } else if (a == "--dp") {
      ranks(o.layout.dp);
    } else if (a == "--tp") {
      ranks(o.layout.tp);
    } else if (a == "--ep") {
      ranks(o.layout.ep);
    } else if (a == "--sp") {
      o.layout.sequence_parallel = true;
      o.transformer = true;
    } else if (a == "--recompute") {
      const std::string_view v = value();
      if (v == "none") o.layout.recompute = zest::recomputation::none;
      else if (v == "selective") o.layout.recompute = zest::recomputation::selective;
      else if (v == "full") o.layout.recompute = zest::recomputation::full;
      else
        throw std::invalid_argument("--recompute: none, selective or full, not '" + std::string(v) +
                                    "'");
      o.transformer = true;
    } else if (a == "--experts") {
      extent(o.model.experts);
    } else if (a == "--top-k") {
      extent(o.model.top_k);
    } else if (a == "--moe-every") {
      extent(o.model.moe_every);
    } else if (a == "--capacity-factor") {
      o.model.capacity_factor = parse_real(a, value());
      o.transformer = true;
    } else if (a == "--cluster") {
      value();  // read above
    } else if (a == "--peak-tflops") {
      o.cluster.peak_flops = parse_real(a, value()) * 1e12;
      o.cluster.name = "given";
    } else if (a == "--peak-gflops") {
      o.cluster.peak_flops = parse_real(a, value()) * 1e9;
      o.cluster.name = "given";
    } else if (a == "--efficiency") {
      o.cluster.efficiency = parse_real(a, value(), 1.0);
    } else if (a == "--dp-gbps") {
      gbps(o.cluster.data);
    } else if (a == "--tp-gbps") {
      gbps(o.cluster.tensor);
    } else if (a == "--ep-gbps") {
      gbps(o.cluster.expert);
    } else if (a == "--dp-latency-us") {
      latency(o.cluster.data);
    } else if (a == "--tp-latency-us") {
      latency(o.cluster.tensor);
    } else if (a == "--ep-latency-us") {
      latency(o.cluster.expert);
    } else if (a == "--memory-gbps") {
      o.cluster.memory_bandwidth = parse_real(a, value()) * 1e9;
    } else if (a == "--activation-passes") {
      o.cluster.activation_passes = parse_real(a, value());
    } else if (a == "--overlap") {
      o.overlap = true;
    } else if (a == "--measure-flops") {
      o.measure_flops = true;
    } else {
      throw std::invalid_argument("unknown argument " + std::string(a));
    }
  }
  if (o.transformer && (o.params || o.ranks))
    throw std::invalid_argument(
        "--params/--ranks plan one flat parameter; a transformer takes --layers, --hidden, ... "
        "and --dp: give one or the other");
  if (arch_llama) {
    zest::transformer_config c = o.model;
    o.model = zest::llama_transformer("Llama-style", c.layers, c.hidden, c.heads, c.kv_heads,
                                      ffn.value_or(8 * c.hidden / 3), c.vocab, c.sequence);
    o.model.experts = c.experts;
    o.model.top_k = c.top_k;
    o.model.moe_every = c.moe_every;
    o.model.capacity_factor = c.capacity_factor;
    if (o.untied) throw std::invalid_argument("--untied: a llama head is untied already");
  } else {
    if (ffn) o.model.ffn_hidden = *ffn;
    if (o.untied) o.model.tied_output = false;
    o.model.name = "GPT";
  }
  return o;
}

// Pads to a width counted in characters, not bytes (the table has Psi and check marks).
std::string pad(const std::string& s, std::size_t width) {
  std::size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0U) != 0x80U ? 1U : 0U;
  return chars >= width ? s + ' ' : s + std::string(width - chars, ' ');
}

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

std::string bytes(double b) {
  return zest::zero_plan::format_decimal_bytes(static_cast<std::uint64_t>(std::llround(b)));
}

std::string count(std::uint64_t n) {
  if (n >= 1'000'000'000ULL) return fixed(static_cast<double>(n) / 1e9, 2) + "B";
  if (n >= 1'000'000ULL) return fixed(static_cast<double>(n) / 1e6, 2) + "M";
  return std::to_string(n);
}

// A figure as the paper prints it: value in GB with `digits` decimals.
struct paper_figure {
  double gigabytes;
  int digits;
};

struct section {
  std::string title;
  zest::model_shape model;
  int ranks;
  std::vector<paper_figure> paper;  // per stage, empty when the paper has none
};

// Prints one section; returns the number of paper figures that disagree.
int print_section(const section& s, const options& o, const zest::training_precision& precision) {
  const zest::mesh_shape<"dp"> mesh({s.ranks});
  const std::uint64_t psi = s.model.parameter_count();
  std::cout << s.title << "\n  " << s.model.name << ", " << count(psi) << " parameters ("
            << s.model.parameters.size()
            << (s.model.parameters.size() == 1 ? " tensor" : " tensors") << ") on "
            << mesh.describe() << ", " << precision.name << ", K = " << precision.k() << "\n\n";
  std::cout << "  " << pad("stage", 7) << pad("params", 11) << pad("grads", 11)
            << pad("optimizer", 11) << pad("total/rank", 12) << pad("formula", 12)
            << (s.paper.empty() ? "" : pad("paper", 11)) << pad("sent/step", 11)
            << pad("× Ψ(N−1)/N", 12) << "collectives\n";
  int agree = 0;
  int disagree = 0;
  std::vector<zest::zero_plan> detailed;
  for (int stage = 0; stage <= 3; ++stage) {
    if (o.stage && *o.stage != stage) continue;
    const zest::zero_plan p = zest::plan_zero(stage, s.model, mesh, precision);
    const auto f = zest::zero_formula(stage, static_cast<double>(psi), s.ranks, precision);
    std::cout << "  " << pad(std::to_string(stage), 7)
              << pad(bytes(static_cast<double>(p.memory.parameters)), 11)
              << pad(bytes(static_cast<double>(p.memory.gradients)), 11)
              << pad(bytes(static_cast<double>(p.memory.optimizer())), 11)
              << pad(bytes(static_cast<double>(p.memory.total())), 12)
              << pad(bytes(f.memory_bytes), 12);
    if (!s.paper.empty()) {
      const paper_figure& fig = s.paper[static_cast<std::size_t>(stage)];
      const double scale = std::pow(10.0, fig.digits);
      const bool same = std::round(static_cast<double>(p.memory.total()) / 1e9 * scale) ==
                        std::round(fig.gigabytes * scale);
      (same ? agree : disagree) += 1;
      std::cout << pad(fixed(fig.gigabytes, fig.digits) + " GB " + (same ? "✓" : "✗"), 11);
    }
    std::cout << pad(bytes(static_cast<double>(p.bytes_sent())), 11)
              << pad(s.ranks > 1 ? fixed(p.psi_coefficient(), 3) : "-", 12)
              << p.collectives_summary() << '\n';
    if (o.stage) detailed.push_back(p);
  }
  if (!s.paper.empty()) {
    std::cout << "\n  paper check: " << agree << " of " << agree + disagree << " agree"
              << (disagree ? " — MISMATCH" : "") << '\n';
  }
  for (const auto& p : detailed) std::cout << '\n' << p;
  std::cout << '\n';
  return disagree;
}

// FLOP/s in TFLOP/s, or GFLOP/s under 1 TFLOP/s (this machine's CPUs).
std::string tflops(double flops) {
  return flops >= 1e12 ? fixed(flops / 1e12, 1) + " TFLOP/s" : fixed(flops / 1e9, 2) + " GFLOP/s";
}

// FLOPs in TFLOP, or GFLOP under 1 TFLOP.
std::string flop_count(double flops) {
  return flops >= 1e12 ? fixed(flops / 1e12, 1) + " TFLOP" : fixed(flops / 1e9, 2) + " GFLOP";
}

std::string seconds(double s) {
  if (s < 1e-3) return fixed(s * 1e6, 1) + " us";
  if (s < 1) return fixed(s * 1e3, 1) + " ms";
  return fixed(s, 2) + " s";
}

std::string link_text(const zest::axis_link& l) {
  return fixed(l.bandwidth / 1e9, 2) + " GB/s + " + fixed(l.latency * 1e6, 1) + " us";
}

struct setup {
  std::string title;
  std::string source;  // where the figures come from
  zest::transformer_config model;
  zest::parallel_layout layout;
  std::optional<double> paper_parameters;  // checked within 5 % (the papers round)
  std::optional<double> paper_flops;       // per GPU, printed beside the estimate
  std::optional<double> device_memory;     // bytes, for "fits"
  std::optional<int> other_stage;          // model states under this stage too
  std::string other_stage_why;
  std::vector<std::string> assumptions;
};

std::string layout_text(const zest::parallel_layout& p) {
  std::ostringstream s;
  s << p.world() << " GPUs as dp " << p.dp << " x tp " << p.tp << " x ep " << p.ep << ", ZeRO-"
    << p.zero_stage << " over dp, sequence parallelism " << (p.sequence_parallel ? "on" : "off")
    << ", recompute " << zest::name_of(p.recompute) << ", micro-batch " << p.micro_batch << " x "
    << p.accumulation << " per data rank (global batch "
    << p.micro_batch * p.accumulation * static_cast<std::size_t>(p.dp * p.ep) << ")";
  return s.str();
}

// Prints a transformer's plan and step time; returns the number of checked figures that
// disagree with the paper's.
int print_transformer(const setup& s, const zest::training_precision& precision,
                      const zest::cluster& cl, bool overlap) {
  const zest::transformer_config& c = s.model;
  const zest::parallel_layout& p = s.layout;
  const zest::transformer_memory m = zest::plan_transformer(c, p, precision);
  int disagree = 0;
  std::cout << s.title << '\n';
  if (!s.source.empty()) std::cout << "  (" << s.source << ")\n";
  std::cout << "  " << c.layers << " layers, hidden " << c.hidden << ", " << c.heads << " heads";
  if (c.kv() != c.heads) std::cout << " (" << c.kv() << " kv)";
  std::cout << ", ffn " << c.ffn() << ", vocab " << c.vocab << ", sequence " << c.sequence;
  if (c.experts > 0)
    std::cout << ", " << c.experts << " experts (top-" << c.top_k << ", every " << c.moe_every
              << "-th layer, capacity factor " << fixed(c.capacity_factor, 2) << ")";
  std::cout << "\n  " << layout_text(p) << ", " << precision.name << '\n';
  for (const auto& a : s.assumptions) std::cout << "  assumed: " << a << '\n';

  std::cout << "  parameters " << count(m.parameter_count);
  if (s.paper_parameters) {
    const double ratio = static_cast<double>(m.parameter_count) / *s.paper_parameters;
    const bool same = std::abs(ratio - 1) <= 0.05;
    disagree += same ? 0 : 1;
    std::cout << " (paper: " << count(static_cast<std::uint64_t>(*s.paper_parameters)) << ", ratio "
              << fixed(ratio, 3) << (same ? " ✓" : " ✗") << ")";
  }
  std::cout << "; this GPU's blocks " << count(m.local_parameters);
  if (m.local_expert_parameters > 0)
    std::cout << " (experts " << count(m.local_expert_parameters) << ")";
  std::cout << '\n';
  const auto& ms = m.states.memory;
  std::cout << "  model states per GPU  parameters " << bytes(static_cast<double>(ms.parameters))
            << ", gradients " << bytes(static_cast<double>(ms.gradients)) << ", optimizer "
            << bytes(static_cast<double>(ms.optimizer())) << ": "
            << bytes(static_cast<double>(ms.total())) << '\n';
  if (s.other_stage) {
    zest::parallel_layout q = p;
    q.zero_stage = *s.other_stage;
    const zest::transformer_memory o = zest::plan_transformer(c, q, precision);
    std::cout << "    with ZeRO-" << q.zero_stage << " instead (" << s.other_stage_why
              << "): model states " << bytes(static_cast<double>(o.states.memory.total()))
              << ", memory per GPU " << bytes(o.total()) << '\n';
  }
  const auto& a = m.activations;
  std::cout << "  activations per GPU   layers " << bytes(a.layers);
  if (a.working > 0) std::cout << ", the layer being recomputed " << bytes(a.working);
  std::cout << ", embedding and head " << bytes(a.outside) << ": " << bytes(a.total()) << '\n';
  std::cout << "  memory per GPU        " << bytes(m.total());
  if (s.device_memory)
    std::cout << (m.total() <= *s.device_memory ? " (fits " : " (does NOT fit ")
              << bytes(*s.device_memory) << ")";
  std::cout << '\n';

  zest::step_estimate t = zest::estimate_step(c, p, cl, precision, overlap);
  std::cout << "  step time on " << cl.name << ": " << tflops(cl.peak_flops) << " peak x "
            << fixed(cl.efficiency, 2) << "; links dp " << link_text(cl.data) << ", tp "
            << link_text(cl.tensor) << ", ep " << link_text(cl.expert) << "; "
            << (overlap ? "communication overlapped with compute" : "no overlap") << '\n';
  auto axis = [](const char* name, const zest::axis_traffic& x) {
    if (x.calls == 0) return;
    std::cout << "    " << name << seconds(x.seconds) << " (" << bytes(x.bytes_sent) << " sent, "
              << fixed(x.calls, 0) << " calls)\n";
  };
  std::cout << "    compute " << seconds(t.compute_seconds) << " (" << flop_count(t.flops)
            << " per GPU";
  if (t.flops > t.model_flops)
    std::cout << ", of which recomputation " << flop_count(t.flops - t.model_flops);
  std::cout << ")\n";
  if (t.memory_seconds > 0)
    std::cout << "    activations' traffic " << seconds(t.memory_seconds) << " (at "
              << fixed(cl.memory_bandwidth / 1e9, 2) << " GB/s, " << fixed(cl.activation_passes, 0)
              << " passes)\n";
  axis("dp ", t.data);
  axis("tp ", t.tensor);
  axis("ep ", t.expert);
  std::cout << "    step " << seconds(t.total_seconds()) << ", " << fixed(t.tokens_per_second(), 0)
            << " tokens/s\n";
  t.overlap = !overlap;
  const double other = t.achieved_flops();
  t.overlap = overlap;
  std::cout << "  predicted " << tflops(t.achieved_flops()) << " per GPU"
            << (overlap ? " (" + tflops(other) + " without overlap)"
                        : " (" + tflops(other) + " with full overlap)");
  if (s.paper_flops)
    std::cout << "; paper: " << fixed(*s.paper_flops / 1e12, 1) << " TFLOP/s, ratio "
              << fixed(t.achieved_flops() / *s.paper_flops, 2);
  std::cout << "\n\n";
  return disagree;
}

// GShard's sweep: per-device weights as devices and experts grow together.
int print_gshard(const zest::training_precision& precision) {
  std::cout << "GShard MoE (Lepikhin et al. 2020): experts over devices, one per device, 36 "
               "layers, every other one with experts;\n"
               "  the paper: 600B parameters at 2048 experts on 2048 TPU v3 cores, per-device "
               "memory about constant as devices and experts grow\n"
               "  assumed: model dim 1024, expert hidden 8192, 16 heads, vocab 32000, sequence "
               "1024, top-2, capacity factor 1 (C = 2 S / E), 2 sequences per device; dp 1, ep = "
               "devices; weights counted at 2 bytes, model states as mixed-precision Adam would "
               "keep them (GShard used Adafactor)\n\n";
  std::cout << "  " << pad("experts", 9) << pad("devices", 9) << pad("parameters", 12)
            << pad("weights/device", 16) << pad("model states", 14) << pad("activations", 13)
            << "paper\n";
  int disagree = 0;
  double first = 0, last = 0;
  for (std::size_t e : {128U, 512U, 2048U}) {
    zest::transformer_config c = zest::gpt_transformer("GShard", 36, 1024, 16, 32000, 1024);
    c.position_table = false;
    c.experts = e;
    c.expert_hidden = 8192;
    c.ffn_hidden = 8192;
    c.top_k = 2;
    zest::parallel_layout p;
    p.ep = static_cast<int>(e);
    p.micro_batch = 2;
    const auto m = zest::plan_transformer(c, p, precision);
    const double weights = static_cast<double>(m.local_parameters) * 2;
    if (first == 0) first = weights;
    last = weights;
    std::string paper;
    if (e == 2048) {
      const double ratio = static_cast<double>(m.parameter_count) / 600e9;
      const bool same = std::abs(ratio - 1) <= 0.05;
      disagree += same ? 0 : 1;
      paper = "600B, ratio " + fixed(ratio, 3) + (same ? " ✓" : " ✗");
    }
    std::cout << "  " << pad(std::to_string(e), 9) << pad(std::to_string(p.world()), 9)
              << pad(count(m.parameter_count), 12) << pad(bytes(weights), 16)
              << pad(bytes(static_cast<double>(m.states.memory.total())), 14)
              << pad(bytes(m.activations.total()), 13) << paper << '\n';
  }
  std::cout << "  weights per device at 2048 / at 128 experts: " << fixed(last / first, 3)
            << " (the router's [h, E] grows with E; all else stays)\n\n";
  return disagree;
}

#if ZEST_HAS_BLAS
// One shape of single-precision product: C[m, n] = op(A)[m, k] op(B)[k, n], `calls` of them
// per step.
struct gemm_shape {
  int m, n, k;
  bool trans_a, trans_b;
  double calls;
  double flops() const { return 2.0 * m * n * k * calls; }
  bool operator<(const gemm_shape& o) const {
    return std::tie(m, n, k, trans_a, trans_b) < std::tie(o.m, o.n, o.k, o.trans_a, o.trans_b);
  }
};

// Seconds per call of one shape (single thread): the median of repetitions over at least
// 0.1 s, after one warmup.
double time_gemm(const gemm_shape& g) {
  namespace blas = zest::host::blas;
  const auto size = [](int r, int c) { return static_cast<std::size_t>(r) * c; };
  std::vector<float> a(size(g.m, g.k), 0.5F), b(size(g.k, g.n), 0.25F), c(size(g.m, g.n));
  const int lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n;
  auto once = [&] {
    blas::sgemm(blas::row_major, g.trans_a ? blas::trans : blas::no_trans,
                g.trans_b ? blas::trans : blas::no_trans, g.m, g.n, g.k, 1.0F, a.data(), lda,
                b.data(), ldb, 0.0F, c.data(), g.n);
  };
  once();
  std::vector<double> times;
  double total = 0;
  while (times.size() < 5 || total < 0.1) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    times.push_back(t);
    total += t;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The matrix products of one training step on one GPU (rank) of a dense transformer: each
// weight's forward product, its input gradient and its weight gradient over the T tokens of a
// micro-batch, and per sequence and head the attention's two forward and four backward
// products; times the micro-batches.
std::vector<gemm_shape> model_gemms(const zest::transformer_config& c,
                                    const zest::parallel_layout& p) {
  const zest::transformer_plan_mesh mesh({p.dp, p.tp, p.ep});
  const int t = static_cast<int>(p.micro_batch * c.sequence);
  const double micro = static_cast<double>(p.accumulation);
  std::map<gemm_shape, double> calls;
  for (const auto& w : zest::place_weights(c, mesh)) {
    if (!w.matmul) continue;
    int in = static_cast<int>(w.local.extents[0]), out = static_cast<int>(w.local.extents[1]);
    if (w.global.name == "wte") std::swap(in, out);  // the tied head: x [T, h] wte^T [h, V]
    calls[{t, out, in, false, false, 0}] += micro;   // y = x w
    calls[{t, in, out, false, true, 0}] += micro;    // dx = dy w^T
    calls[{in, out, t, true, false, 0}] += micro;    // dw = x^T dy
  }
  const int s = static_cast<int>(c.sequence), d = static_cast<int>(c.head_dim());
  const double heads =
      static_cast<double>(p.micro_batch * c.heads / static_cast<std::size_t>(p.tp));
  const double per_layer = heads * static_cast<double>(c.layers) * micro;
  calls[{s, s, d, false, true, 0}] += per_layer;   // q k^T
  calls[{s, d, s, false, false, 0}] += per_layer;  // p v
  calls[{s, s, d, false, true, 0}] += per_layer;   // dp = do v^T
  calls[{s, d, s, true, false, 0}] += per_layer;   // dv = p^T do
  calls[{s, d, s, false, false, 0}] += per_layer;  // dq = ds k
  calls[{s, d, s, true, false, 0}] += per_layer;   // dk = ds^T q
  std::vector<gemm_shape> out;
  for (const auto& [shape, n] : calls) {
    gemm_shape g = shape;
    g.calls = n;
    out.push_back(g);
  }
  return out;
}

// Bytes/s of streaming over a buffer larger than the caches: a write pass and a
// read-modify-write pass over 64 MiB of floats, as element-wise kernels move activations.
double measure_memory_bandwidth() {
  std::vector<float> x(std::size_t{16} << 20, 1.0F);
  std::vector<double> rates;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::fill(x.begin(), x.end(), static_cast<float>(r));
    for (float& v : x) v = v * 0.5F + 1.0F;
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) rates.push_back(3.0 * static_cast<double>(x.size() * sizeof(float)) / sec);
  }
  std::sort(rates.begin(), rates.end());
  if (x[12345] < 0) std::cout << "";  // keeps the passes
  return rates[rates.size() / 2];
}

struct machine_figures {
  double peak = 0;        // sgemm n = 1024, FLOP/s
  double efficiency = 1;  // the model's products / peak
  double memory = 0;      // bytes/s
};

// --measure-flops: this machine's sgemm at n = 1024; with a model, the FLOP rate of that
// model's own products and the memory bandwidth, as the time model's flags.
machine_figures measure(const options& o, bool print) {
  machine_figures m;
  const double peak = time_gemm({1024, 1024, 1024, false, false, 1});
  const double peak_rate = 2.0 * 1024 * 1024 * 1024 / peak;
  m.peak = peak_rate;
  if (print)
    std::cout << "sgemm n = 1024, one thread: " << fixed(peak_rate / 1e9, 2) << " GFLOP/s\n";
  if (!o.transformer) return m;
  if (o.model.experts > 0)
    throw std::invalid_argument(
        "--measure-flops and --cluster this-machine time the products "
        "of dense models only");
  double flops = 0, seconds = 0;
  for (const auto& g : model_gemms(o.model, o.layout)) {
    const double t = time_gemm(g);
    flops += g.flops();
    seconds += t * g.calls;
    std::cout << "  " << g.m << " x " << g.n << " x " << g.k << (g.trans_a ? " A^T" : "")
              << (g.trans_b ? " B^T" : "") << ", " << fixed(g.calls, 0)
              << " per step: " << fixed(2.0 * g.m * g.n * g.k / t / 1e9, 2) << " GFLOP/s\n";
  }
  const double rate = flops / seconds;
  const double memory = measure_memory_bandwidth();
  m.efficiency = std::min(1.0, rate / peak_rate);
  m.memory = memory;
  if (!print) return m;
  std::cout << "this model's products: " << fixed(rate / 1e9, 2) << " GFLOP/s, efficiency "
            << fixed(rate / peak_rate, 4) << " of the sgemm\n"
            << "memory: " << fixed(memory / 1e9, 3) << " GB/s\n"
            << "flags: --peak-gflops " << fixed(peak_rate / 1e9, 3) << " --efficiency "
            << fixed(std::min(1.0, rate / peak_rate), 4) << " --memory-gbps "
            << fixed(memory / 1e9, 3) << '\n';
  return m;
}
#endif

bool options_given(int argc, char** argv, std::string_view flag) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == flag) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse(argc, argv);
    if (o.transformer) zest::check_transformer(o.model, o.layout);
  } catch (const std::exception& e) {
    std::cerr << "plan: " << e.what() << "\n\n" << usage;
    return 2;
  }
  if (o.measure_flops || o.measured_cluster) {
#if ZEST_HAS_BLAS
    try {
      const machine_figures m = measure(o, o.measure_flops);
      if (o.measure_flops) return 0;
      if (!o.transformer)
        throw std::invalid_argument("--cluster this-machine plans a transformer: give its flags");
      // Measured figures, unless given.
      if (!options_given(argc, argv, "--peak-gflops") &&
          !options_given(argc, argv, "--peak-tflops"))
        o.cluster.peak_flops = m.peak;
      if (!options_given(argc, argv, "--efficiency")) o.cluster.efficiency = m.efficiency;
      if (!options_given(argc, argv, "--memory-gbps")) o.cluster.memory_bandwidth = m.memory;
    } catch (const std::exception& e) {
      std::cerr << "plan: " << e.what() << "\n\n" << usage;
      return 2;
    }
#else
    std::cerr << "plan: --measure-flops and --cluster this-machine need BLAS (this build has "
                 "none)\n";
    return 2;
#endif
  }
  const zest::training_precision& precision = o.fp32 ? zest::fp32_adam : zest::mixed_precision_adam;

  if (o.transformer) {
    setup s;
    s.title = "Transformer";
    s.model = o.model;
    s.layout = o.layout;
    print_transformer(s, precision, o.cluster, o.overlap);
    return 0;
  }

  std::cout << "zest plan — per-GPU memory and communication per step, from the layouts; rank 0 of "
               "every axis;\n"
               "decimal units (1 GB = 1e9 B) as in the ZeRO paper\n\n";

  std::vector<section> sections;
  const std::uint64_t paper_psi = 7'500'000'000ULL;
  if (o.params || o.ranks) {
    const std::uint64_t psi = o.params.value_or(paper_psi);
    const int ranks = o.ranks.value_or(64);
    sections.push_back({"Flat model", zest::flat_model(psi, "one flat parameter"), ranks, {}});
  } else {
    sections.push_back(
        {"ZeRO paper example (Rajbhandari et al. 2020, Figure 1): Ψ = 7.5B, N_d = 64",
         zest::flat_model(paper_psi, "one flat parameter"),
         64,
         {}});
    sections.push_back({"GPT-2 small, per-tensor splits (first dim, balanced blocks), N_d = 4",
                        zest::gpt_model(zest::gpt2_small, "GPT-2 small"),
                        4,
                        {}});
  }
  // The paper's figures hold for its setting: mixed precision, 7.5B over 64.
  for (auto& s : sections) {
    if (!o.fp32 && s.ranks == 64 && s.model.parameters.size() == 1 &&
        s.model.parameter_count() == paper_psi) {
      s.paper = {{120, 0}, {31.4, 1}, {16.6, 1}, {1.9, 1}};
    }
  }

  int disagree = 0;
  for (const auto& s : sections) disagree += print_section(s, o, precision);
  if (o.params || o.ranks) return disagree == 0 ? 0 : 1;

  // The published setups, on the DGX-2 V100 cluster (zest/zero/cost_model.hpp).
  const zest::cluster v100 = zest::dgx2_v100_cluster();
  std::vector<setup> setups;
  {
    setup s;
    s.title =
        "Turing-NLG (Microsoft, February 2020): Megatron tensor slicing x ZeRO-1 data parallelism";
    s.source =
        "17B parameters, 78 layers, hidden 4256, 28 heads, TP 4 x DP 64 on 256 V100, batch 512, "
        "as the announcement is read here; 41.4 TFLOP/s per GPU sustained (ZeRO paper, "
        "section 10.6)";
    s.model = zest::gpt_transformer("Turing-NLG", 78, 4256, 28, 50257, 1024);
    s.layout.dp = 64;
    s.layout.tp = 4;
    s.layout.zero_stage = 1;
    s.layout.micro_batch = 8;
    s.layout.recompute = zest::recomputation::full;
    s.paper_parameters = 17e9;
    s.paper_flops = 41.4e12;
    s.device_memory = 32e9;
    s.other_stage = 2;
    s.other_stage_why =
        "the ZeRO paper's section 10.6 says ZeRO-100B, P_os+g, trained it; DeepSpeed's "
        "release of the time implemented stage 1";
    s.assumptions = {
        "GPT-2's vocabulary (50257) and sequence (1024); 8 sequences per data rank "
        "(512 / 64), no accumulation; Megatron's activation checkpointing (full "
        "recomputation); tp inside a DGX-2 node, dp across nodes"};
    setups.push_back(std::move(s));
  }
  {
    setup s;
    s.title = "ZeRO paper (Rajbhandari et al. 2020): 100B parameters on 400 V100 (25 DGX-2)";
    s.source =
        "ZeRO-100B: ZeRO-DP P_os+g (stage 2) and ZeRO-R x Megatron model parallelism 16 within "
        "a node; 15 PFLOP/s, 38 TFLOP/s per GPU; 800 Gbps between nodes (sections 10.1-10.2)";
    s.model = zest::gpt_transformer("ZeRO 100B", 125, 8192, 64, 50257, 1024);
    s.layout.dp = 25;
    s.layout.tp = 16;
    s.layout.zero_stage = 2;
    s.layout.micro_batch = 8;
    s.layout.recompute = zest::recomputation::full;
    s.layout.sequence_parallel = true;
    s.paper_parameters = 100e9;
    s.paper_flops = 38e12;
    s.device_memory = 32e9;
    s.assumptions = {
        "125 layers of hidden 8192 (100B; the paper's Table 4 has its configurations), 64 "
        "heads, vocabulary 50257, sequence 1024, "
        "8 sequences per data rank; full recomputation with the checkpoints split "
        "over the model-parallel GPUs (ZeRO-R's P_a; planned as sequence "
        "parallelism, which moves the same bytes)"};
    setups.push_back(std::move(s));
  }
  for (const auto& s : setups) disagree += print_transformer(s, precision, v100, false);
  disagree += print_gshard(precision);
  std::cout << "published check: " << (disagree == 0 ? "all figures agree" : "MISMATCH") << '\n';
  return disagree == 0 ? 0 : 1;
}
