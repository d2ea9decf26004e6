// zest/report.hpp — the umbrella of a training run's reports: the JSON log of its steps,
// SVG plots of its curves and the progress line on a terminal.
//
//   #include <zest/report.hpp>
//   zest::report::training_log log;                            // zest/report/training_log.hpp
//   zest::report::progress_line progress(total_steps);         // zest/report/progress.hpp
//   auto svg = zest::report::svg_line_plot({train_loss}, {});  // zest/report/svg_plot.hpp
//
// Apart from zest/zest.hpp: none of it is needed to compute, and each pulls code of its own
// (a JSON writer, an SVG writer, terminal handling).
#pragma once

#include "zest/core/files.hpp"
#include "zest/core/json.hpp"

#include "zest/report/progress.hpp"
#include "zest/report/svg_plot.hpp"
#include "zest/report/training_log.hpp"
