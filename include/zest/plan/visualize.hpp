// zest/plan/visualize.hpp — an ASCII map of which ranks hold which block of a 2-D tensor.
//
//   std::cout << zest::visualize(w);     // w: "mh" [8x6] split(m:dp) on mesh<dp=2, tp=2>
//   "mh" [8x6] split(m:dp) on mesh<dp=2, tp=2>
//              h 0..5
//   m 0..3 | 0,1
//   m 4..7 | 2,3
//
// Each cell is a block of the global tensor; it lists the ranks (row-major mesh order) that
// hold it. On a partial axis every rank holds a summand of the same block, noted below.
#pragma once

#include <algorithm>
#include <cstddef>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "zest/layout/shard.hpp"
#include "zest/tensor/tensor.hpp"

namespace zest {

template <sharded_tensor X>
std::string visualize(const X& x) {
  static_assert(X::rank == 2,
                "zest visualize: draws 2-D tensors; redistribute or einsum to 2 dims first");
  using mesh_t = typename X::mesh_type;
  const auto& mesh = x.mesh();
  const int world = mesh.world_size();
  struct held {
    block_range rows, cols;
    int rank;
  };
  std::vector<held> blocks;
  std::set<std::size_t> row_cuts{0, x.extents()[0]}, col_cuts{0, x.extents()[1]};
  for (int r = 0; r < world; ++r) {
    std::array<int, mesh_t::axis_count> coords{};
    int rest = r;
    for (std::size_t a = mesh_t::axis_count; a-- > 0;) {
      coords[a] = rest % mesh.size(a);
      rest /= mesh.size(a);
    }
    const block_range rows = dim_range(X::layout, X::dims[0], x.extents()[0], mesh.sizes(), coords);
    const block_range cols = dim_range(X::layout, X::dims[1], x.extents()[1], mesh.sizes(), coords);
    blocks.push_back({rows, cols, r});
    row_cuts.insert(rows.offset);
    row_cuts.insert(rows.offset + rows.size);
    col_cuts.insert(cols.offset);
    col_cuts.insert(cols.offset + cols.size);
  }
  const std::vector<std::size_t> rc(row_cuts.begin(), row_cuts.end()),
      cc(col_cuts.begin(), col_cuts.end());
  auto label = [](char d, std::size_t lo, std::size_t hi) {
    return std::string(1, d) + ' ' + std::to_string(lo) + ".." +
           (hi > lo ? std::to_string(hi - 1) : "-");
  };
  std::vector<std::string> col_heads;
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> row_heads;
  for (std::size_t j = 0; j + 1 < cc.size(); ++j)
    col_heads.push_back(label(X::dims[1], cc[j], cc[j + 1]));
  for (std::size_t i = 0; i + 1 < rc.size(); ++i) {
    row_heads.push_back(label(X::dims[0], rc[i], rc[i + 1]));
    cells.emplace_back();
    for (std::size_t j = 0; j + 1 < cc.size(); ++j) {
      std::string who;
      for (const auto& b : blocks) {
        const bool has_row = b.rows.offset <= rc[i] && rc[i] < b.rows.offset + b.rows.size;
        const bool has_col = b.cols.offset <= cc[j] && cc[j] < b.cols.offset + b.cols.size;
        if (has_row && has_col) {
          if (!who.empty()) who += ',';
          who += std::to_string(b.rank);
        }
      }
      cells.back().push_back(who.empty() ? "-" : who);
    }
  }
  std::size_t head_w = 0, cell_w = 0;
  for (const auto& h : row_heads) head_w = std::max(head_w, h.size());
  for (const auto& h : col_heads) cell_w = std::max(cell_w, h.size());
  for (const auto& row : cells)
    for (const auto& c : row) cell_w = std::max(cell_w, c.size());
  std::ostringstream out;
  out << '"' << view_of<X::dims> << "\" [" << x.extents()[0] << 'x' << x.extents()[1] << "] "
      << to_string(X::layout, mesh_t::axis_names) << " on " << mesh.describe() << '\n';
  auto pad = [](const std::string& s, std::size_t w) {
    return s + std::string(w > s.size() ? w - s.size() : 0, ' ');
  };
  out << std::string(head_w + 3, ' ');
  for (const auto& h : col_heads) out << pad(h, cell_w + 2);
  out << '\n';
  for (std::size_t i = 0; i < cells.size(); ++i) {
    out << pad(row_heads[i], head_w) << " | ";
    for (const auto& c : cells[i]) out << pad(c, cell_w + 2);
    out << '\n';
  }
  std::string empty;
  for (const auto& b : blocks) {
    if (b.rows.size == 0 || b.cols.size == 0)
      empty += (empty.empty() ? "" : ",") + std::to_string(b.rank);
  }
  if (!empty.empty()) out << "(nothing on ranks " << empty << ")\n";
  for (std::size_t a = 0; a < mesh_t::axis_count; ++a) {
    if (X::layout.is_partial(a)) {
      out << "(partial over " << mesh_t::axis_names[a]
          << ": the ranks listed hold summands of each block)\n";
    }
  }
  return out.str();
}

}  // namespace zest
