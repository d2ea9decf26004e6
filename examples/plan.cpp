// plan — per-rank model-state memory and communication per step under ZeRO stages 0-3,
// derived from the stages' layouts (zest/zero/planner.hpp). One process, no MPI, any size:
//
//   build/default/examples/plan                       # the ZeRO paper's example, 17B, GPT-2 small
//   build/default/examples/plan --params 175B --ranks 1024 --stage 3
//   build/default/examples/plan --help
//
// Figures are for rank 0 of the data axis (with balanced blocks the first ranks hold the
// most), in decimal units as in the ZeRO paper (1 GB = 1e9 bytes). The exit status is 1 when
// a figure of the paper's example does not come out as the paper prints it.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "zest/mesh/mesh_shape.hpp"
#include "zest/zero/planner.hpp"
#include "zest/zero/stage.hpp"

namespace {

struct options {
  std::optional<std::uint64_t> params;
  std::optional<int> ranks;
  std::optional<int> stage;
  bool fp32 = false;
};

constexpr std::string_view usage =
    "usage: plan [--params N] [--ranks N] [--stage K] [--fp32] [--help]\n"
    "\n"
    "Prints, per ZeRO stage, the model-state memory of one rank and the bytes it sends per\n"
    "training step, derived from the stage's layouts (parameter stored/used, gradient\n"
    "produced/kept, optimizer state) and zest's byte model of the transitions.\n"
    "\n"
    "Without --params/--ranks: the ZeRO paper's example (7.5B parameters, N_d = 64, checked\n"
    "against the paper's figures), a Turing-NLG-sized model (17B, N_d = 256) and GPT-2 small\n"
    "on 4 ranks.\n"
    "\n"
    "  --params N   one flat parameter of N elements (suffixes k, M, B, T: 7.5B, 175B)\n"
    "  --ranks N    data-parallel ranks N_d (default 64)\n"
    "  --stage K    only stage K (0-3), with the plan's phases in detail\n"
    "  --fp32       fp32 parameters and gradients (K = 8) instead of bf16/fp16 (K = 12)\n";

// "7.5B" -> 7'500'000'000
std::uint64_t parse_count(std::string_view text) {
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
  const double v = std::stod(s, &used);
  if (used != s.size() || !(v > 0))
    throw std::invalid_argument("not a positive count: " + std::string(text));
  return static_cast<std::uint64_t>(std::llround(v * scale));
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      std::exit(0);
    } else if (a == "--params") {
      o.params = parse_count(value());
    } else if (a == "--ranks") {
      const auto n = parse_count(value());
      if (n > 1'000'000'000ULL) throw std::invalid_argument("--ranks: too many ranks");
      o.ranks = static_cast<int>(n);
    } else if (a == "--stage") {
      const auto k = parse_count(value());
      if (k > 3) throw std::invalid_argument("--stage: ZeRO has stages 0-3");
      o.stage = static_cast<int>(k);
    } else if (a == "--fp32") {
      o.fp32 = true;
    } else {
      throw std::invalid_argument("unknown argument " + std::string(a));
    }
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

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "plan: " << e.what() << "\n\n" << usage;
    return 2;
  }
  const zest::training_precision& precision = o.fp32 ? zest::fp32_adam : zest::mixed_precision_adam;

  std::cout
      << "zest plan — ZeRO per-rank model-state memory and communication per step, from the "
         "stages'\n"
         "layouts; rank 0 of the data axis; decimal units (1 GB = 1e9 B) as in the ZeRO paper\n\n";

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
    sections.push_back({"Turing-NLG-sized: Ψ = 17B, N_d = 256",
                        zest::flat_model(17'000'000'000ULL, "one flat parameter"),
                        256,
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
  return disagree == 0 ? 0 : 1;
}
