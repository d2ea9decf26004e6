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

#include <array>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>

#include "train_gpt.hpp"
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

// The policy-independent parts of a run (declared in train_gpt.hpp).

void print_header(const flags& f, const zest::text_dataset& data, std::size_t vocab,
                  std::size_t params, const std::string& mesh, std::size_t moe_layers,
                  std::int64_t model_state_bytes, double planner_bytes, double entropy) {
  std::cout << "train_gpt: " << zest::report::format_count(static_cast<double>(params))
            << " parameters, " << f.layers << " layers, width " << f.width << ", vocab "
            << data.vocab_size() << " (padded " << vocab << "), ZeRO-" << f.zero << ", "
            << f.precision << ", " << mesh << ", batch " << f.batch << " x " << f.context
            << " tokens"
            << (f.moe
                    ? ", MoE " + std::to_string(f.experts) + " experts top-" +
                          std::to_string(f.top_k) + " in " + std::to_string(moe_layers) + " layers"
                    : std::string())
            << '\n';
  std::cout << "model states per rank: "
            << zest::report::format_bytes(static_cast<double>(model_state_bytes));
  // The planner's model has every parameter replicated off the data axis (no experts).
  if (!f.moe) std::cout << " (planner: " << zest::report::format_bytes(planner_bytes) << ")";
  std::cout << "; unigram entropy of the text " << entropy << " nats\n";
}

zest::report::training_log start_log(const flags& f, std::size_t vocab, const std::string& mesh,
                                     std::size_t params, double entropy,
                                     std::int64_t model_state_bytes) {
  zest::report::training_log log;
  if (!f.log.empty() && !f.load.empty() && std::filesystem::exists(f.log)) {
    log = zest::report::training_log::read(f.log);
  }
  log.set("config", config_json(f, vocab));
  log.set("zero_stage", static_cast<std::int64_t>(f.zero));
  log.set("precision", f.precision);
  log.set("mesh", mesh);
  log.set("parameters", static_cast<std::int64_t>(params));
  log.set("unigram_entropy_nats", entropy);
  log.set("model_state_bytes_per_rank", static_cast<std::int64_t>(model_state_bytes));
  return log;
}

zest::json::value step_record(std::int64_t step, const zest::train_step_result& r,
                              double tokens_per_step, bool loss_scaling, const moe_figures* moe) {
  zest::json::object rec;
  rec.emplace_back("step", step + 1);
  rec.emplace_back("loss", r.loss);
  rec.emplace_back("lr", r.report.lr);
  rec.emplace_back("grad_norm", r.report.grad_norm);
  rec.emplace_back("applied", r.report.applied);
  rec.emplace_back("seconds", r.seconds);
  rec.emplace_back("tokens_per_s", tokens_per_step / r.seconds);
  rec.emplace_back("bytes_sent", static_cast<std::int64_t>(r.traffic.bytes_sent()));
  rec.emplace_back("scalar_bytes_sent", static_cast<std::int64_t>(r.scalar_traffic.bytes_sent()));
  rec.emplace_back("peak_bytes", r.peak_bytes);
  if (loss_scaling) rec.emplace_back("loss_scale", static_cast<double>(r.report.loss_scale));
  if (moe) {
    rec.emplace_back("nll", moe->nll);
    rec.emplace_back("aux_loss", moe->aux_loss);
    rec.emplace_back("dropped_fraction", moe->dropped_fraction);
    zest::json::array per_expert;
    for (auto c : moe->tokens_per_expert) per_expert.emplace_back(c);
    rec.emplace_back("tokens_per_expert", std::move(per_expert));
  }
  return zest::json::value(std::move(rec));
}

std::string progress_text(const zest::train_step_result& r, double tokens_per_step,
                          std::int64_t model_state_bytes, const moe_figures* moe) {
  std::ostringstream line;
  line.precision(4);
  line << "loss " << r.loss << "  " << zest::report::format_count(tokens_per_step / r.seconds)
       << " tok/s  states " << zest::report::format_bytes(static_cast<double>(model_state_bytes))
       << "  peak " << zest::report::format_bytes(static_cast<double>(r.peak_bytes)) << "  sent "
       << zest::report::format_bytes(static_cast<double>(r.traffic.bytes_sent())) << "/step";
  if (moe) {
    const auto [lo, hi] =
        std::minmax_element(moe->tokens_per_expert.begin(), moe->tokens_per_expert.end());
    line << "  aux " << moe->aux_loss << "  dropped " << 100 * moe->dropped_fraction
         << "%  experts max/min " << *hi << "/" << *lo << " tok";
  }
  if (!r.report.applied) line << "  (skipped: inf/nan, scale " << r.report.loss_scale << ")";
  return line.str();
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
    std::cout << "final loss " << last_loss << " nats (unigram entropy " << entropy << "), "
              << trained << " steps in " << zest::report::format_duration(seconds) << ", "
              << zest::report::format_count(
                     trained > 0 ? tokens_per_step * static_cast<double>(trained) / seconds : 0)
              << " tok/s\n";
    if (!sample.empty()) std::cout << "sample:\n" << sample << "\n";
  }
  log.set_summary("final_loss", last_loss);
  log.set_summary("steps_trained", trained);
  log.set_summary("seconds", seconds);
  if (!sample.empty()) log.set_summary("sample", sample);
  if (!f.log.empty()) log.write(f.log);
  if (!f.plot.empty()) {
    zest::report::series loss{"loss", {}, {}};
    zest::report::series aux{"aux loss (right axis)", {}, {}};
    aux.secondary_axis = true;
    const auto j = log.to_json();
    for (const auto& s : j["steps"].as_array()) {
      loss.x.push_back(s["step"].as_number());
      loss.y.push_back(s["loss"].as_number());
      if (const auto* a = s.find("aux_loss")) {
        aux.x.push_back(s["step"].as_number());
        aux.y.push_back(a->as_number());
      }
    }
    zest::report::plot_options po;
    po.title = "train_gpt: ZeRO-" + std::to_string(f.zero) + ", " + mesh;
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
}  // namespace train_gpt_example

#if !defined(ZEST_TRAIN_GPT_CUDA)
// This build has no CUDA (ZEST_CUDA=OFF, or no nvcc/NCCL found): --device cuda says so.
int train_gpt_example::train_on_cuda(const flags&, const zest::text_dataset&, std::array<int, 2>) {
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
    const auto f = parse(argc, argv);
    if (!f) {
      if (rank == 0) std::cout << usage;
      return 0;
    }
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int ep = f->ep;
    if (ep == 0) {
      ep = 1;
      if (f->moe) {
        for (int d = 1; d <= world; ++d) {
          if (world % d == 0 && f->experts % static_cast<std::size_t>(d) == 0) ep = d;
        }
      }
    }
    if (world % ep != 0) {
      throw std::invalid_argument("train_gpt: --ep " + std::to_string(ep) +
                                  " does not divide the " + std::to_string(world) + " ranks");
    }
    const std::array<int, 2> sizes{world / ep, ep};
    const auto data = f->corpus.empty() ? zest::text_dataset::from_path()
                                        : zest::text_dataset::from_path(f->corpus);
    if (f->device == "cuda") return train_on_cuda(*f, data, sizes);
    return train_on<cpu_mesh, zest::float16>(*f, data, sizes);
  } catch (const std::exception& e) {
    // An error that only this rank saw (a bad token id in its shard, a full disk) would
    // leave the others waiting in a collective: take the whole job down, but only once
    // every rank's message is out (zest/comm/mpi_environment.hpp).
    zest::report_and_abort(e);
  }
}
