// zest/mesh/mesh.hpp — an n-D grid of ranks with named axes.
//
//   zest::mesh<"dp", "tp"> m(MPI_COMM_WORLD, {2, 2});   // 4 ranks: (dp, tp) row-major
//   m.size(0) == 2; m.coord(1) == rank % 2; m.axis<"tp">() is the tp sub-communicator
//
// Axis names are compile-time (layouts name them); sizes are run-time. Rank r of the
// parent communicator sits at the row-major coordinates of r, the first axis major, so
// ranks that differ only in the last axis are neighbours (put the axis with the heaviest
// traffic last). Each axis owns a communicator over the ranks that differ only along it.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/comm/communicator.hpp"
#include "zest/comm/local_communicator.hpp"
#include "zest/config.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/core/source_site.hpp"

#if ZEST_HAS_MPI
#include <mpi.h>

#include "zest/comm/detail/mpi_comms.hpp"
#include "zest/comm/mpi_communicator.hpp"
#endif

namespace zest {

namespace detail {
// The rank at `coords` of a mesh of `sizes`: row-major, the first axis major, the order in
// which a mesh numbers the ranks of its parent communicator.
template <std::size_t N>
constexpr int row_major_rank(const std::array<int, N>& sizes, const std::array<int, N>& coords) {
  int r = 0;
  for (std::size_t a = 0; a < N; ++a) r = r * sizes[a] + coords[a];
  return r;
}

template <fixed_string... Axes>
constexpr bool axis_names_valid() {
  constexpr std::array<std::string_view, sizeof...(Axes)> names{view_of<Axes>...};
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) return false;
    for (std::size_t j = 0; j < i; ++j) {
      if (names[i] == names[j]) return false;
    }
  }
  return true;
}
}  // namespace detail

template <class Comm, fixed_string... Axes>
class basic_mesh {
  static_assert(communicator<Comm>, "zest mesh: Comm must model zest::communicator");
  static_assert(sizeof...(Axes) >= 1 && sizeof...(Axes) <= max_axes,
                "zest mesh: a mesh has 1 to zest::max_axes axes");
  static_assert(detail::axis_names_valid<Axes...>(),
                "zest mesh: axis names must be non-empty and distinct, e.g. mesh<\"dp\", \"tp\">");

 public:
  using communicator_type = Comm;
  static constexpr std::size_t axis_count = sizeof...(Axes);
  static constexpr std::array<std::string_view, axis_count> axis_names{view_of<Axes>...};

  // Index of an axis by name, at compile time.
  template <fixed_string Axis>
  static constexpr std::size_t axis_index() {
    constexpr std::size_t i = [] {
      for (std::size_t k = 0; k < axis_count; ++k) {
        if (axis_names[k] == view_of<Axis>) return k;
      }
      return axis_count;
    }();
    static_assert(i < axis_count, "zest mesh: no axis of that name in this mesh");
    return i;
  }

  // A mesh of one process: every axis has size 1. Needs no MPI.
  basic_mesh() requires std::constructible_from<Comm, std::string> {
    sizes_.fill(1);
    coords_.fill(0);
    for (std::size_t a = 0; a < axis_count; ++a) {
      axes_[a] = std::make_unique<Comm>(std::string(axis_names[a]));
    }
    world_ = std::make_unique<Comm>(std::string("world"));
  }

#if ZEST_HAS_MPI
  // A mesh over the ranks of `parent`. One size may be -1: it takes what the others leave.
  basic_mesh(MPI_Comm parent, std::array<int, axis_count> sizes) requires
      std::constructible_from<Comm, MPI_Comm, std::string> {
    int world_size = 0;
    MPI_Comm_size(parent, &world_size);
    MPI_Comm_rank(parent, &rank_);
    sizes_ = resolve_sizes(sizes, world_size);
    int rest = rank_;
    for (std::size_t a = axis_count; a-- > 0;) {
      coords_[a] = rest % sizes_[a];
      rest /= sizes_[a];
    }
    for (std::size_t a = 0; a < axis_count; ++a) {
      // Ranks that agree on every other coordinate share the axis communicator, in the
      // order of their coordinate along it. Made from the group (comm/detail/mpi_comms.hpp
      // says why not MPI_Comm_split); the axis index tells the calls apart.
      std::vector<int> members(static_cast<std::size_t>(sizes_[a]));
      auto at = coords_;
      for (int k = 0; k < sizes_[a]; ++k) {
        at[a] = k;
        members[static_cast<std::size_t>(k)] = detail::row_major_rank(sizes_, at);
      }
      detail::owned_comm sub;  // Comm keeps duplicates of it
      if (const int code =
              detail::group_communicator(parent, members, static_cast<int>(a), &sub.comm);
          code != MPI_SUCCESS) {
        throw communicator_error(
            detail::message("zest: mesh: making the communicator of axis '", axis_names[a],
                            "' failed: MPI error: ", detail::mpi_error_text(code)));
      }
      axes_[a] = std::make_unique<Comm>(sub.comm, std::string(axis_names[a]));
    }
    world_ = std::make_unique<Comm>(parent, std::string("world"));
  }
#endif

  basic_mesh(basic_mesh&&) noexcept = default;
  basic_mesh& operator=(basic_mesh&&) noexcept = default;
  basic_mesh(const basic_mesh&) = delete;
  basic_mesh& operator=(const basic_mesh&) = delete;
  ~basic_mesh() = default;

  int size(std::size_t axis) const { return sizes_[axis]; }
  int coord(std::size_t axis) const { return coords_[axis]; }
  const std::array<int, axis_count>& sizes() const { return sizes_; }
  const std::array<int, axis_count>& coords() const { return coords_; }
  int rank() const { return rank_; }
  int world_size() const {
    int n = 1;
    for (int s : sizes_) n *= s;
    return n;
  }

  // The communicator along one axis; collectives on a tensor go through these.
  Comm& axis(std::size_t a) const { return *axes_[a]; }
  template <fixed_string Axis>
  Comm& axis() const {
    return *axes_[axis_index<Axis>()];
  }
  // All ranks of the mesh, for scalars (a loss, a norm) that every rank needs.
  Comm& world() const { return *world_; }

  // Counters summed over the axis communicators (the world communicator is apart).
  comm_stats stats() const {
    comm_stats s;
    for (const auto& c : axes_) s += c->stats();
    return s;
  }
  void reset_stats() const {
    for (const auto& c : axes_) c->reset_stats();
    world_->reset_stats();
  }

  // "mesh<dp=2, tp=2>"
  std::string describe() const {
    std::string s = "mesh<";
    for (std::size_t a = 0; a < axis_count; ++a) {
      if (a) s += ", ";
      s += axis_names[a];
      s += '=';
      s += std::to_string(sizes_[a]);
    }
    return s + '>';
  }

 private:
  static std::array<int, axis_count> resolve_sizes(std::array<int, axis_count> sizes, int world) {
    int known = 1;
    int free_axis = -1;
    for (std::size_t a = 0; a < axis_count; ++a) {
      if (sizes[a] == -1 && free_axis < 0) {
        free_axis = static_cast<int>(a);
      } else if (sizes[a] <= 0) {
        throw shape_error(
            detail::message("zest: mesh: axis '", axis_names[a], "' has size ", sizes[a],
                            "; sizes must be positive (one may be -1 to take the rest)"));
      } else {
        known *= sizes[a];
      }
    }
    if (free_axis >= 0) {
      if (world % known != 0) {
        throw shape_error(detail::message("zest: mesh: the other axes take ", known,
                                          " ranks, which does not divide the ", world,
                                          " ranks of the communicator"));
      }
      sizes[static_cast<std::size_t>(free_axis)] = world / known;
      known = world;
    }
    if (known != world) {
      std::string shape;
      for (std::size_t a = 0; a < axis_count; ++a) {
        shape += (a ? " x " : "") + std::string(axis_names[a]) + '=' + std::to_string(sizes[a]);
      }
      throw shape_error(detail::message("zest: mesh: ", shape, " needs ", known,
                                        " ranks, but the communicator has ", world,
                                        "; run with mpiexec -n ", known, " or change the sizes"));
    }
    return sizes;
  }

  std::array<int, axis_count> sizes_{};
  std::array<int, axis_count> coords_{};
  int rank_ = 0;
  std::array<std::unique_ptr<Comm>, axis_count> axes_;
  std::unique_ptr<Comm> world_;
};

// Compares the collectives each communicator of `mesh` (every axis, then the world) issued on
// its ranks so far, as mpi_communicator::check_schedule does: on a difference, every rank
// throws collective_mismatch naming `where` and the first call that differs on each rank.
// Every rank calls it at the same point of its program; zero_engine::step does, once per
// optimizer step. (A communicator of one rank agrees with itself.)
// (The mesh is taken whole, not as basic_mesh<Comm, Axes...>: nvcc's front end does not deduce
// class-type template arguments through a derived class.)
template <class Mesh>
requires requires(const Mesh& m) {
  m.world();
  m.axis(std::size_t{0});
  Mesh::axis_count;
}
void check_schedule(const Mesh& mesh, std::string_view where = {},
                    source_site at = source_site::current()) {
  const auto check = [&](auto& c) {
    if constexpr (requires { c.check_schedule(where, at); }) {
      c.check_schedule(where, at);
    }
  };
  for (std::size_t a = 0; a < Mesh::axis_count; ++a) check(mesh.axis(a));
  check(mesh.world());
}

// Every communicator's schedule_fingerprint (the axes in order, then the world), on this
// rank: equal across the ranks when they issued the same collectives, and across runs on
// meshes made alike when the runs did. A communicator that keeps no record gives {0, 0}.
template <class Mesh>
requires requires(const Mesh& m) {
  m.world();
  m.axis(std::size_t{0});
  Mesh::axis_count;
}
std::vector<schedule_fingerprint> schedule_of(const Mesh& mesh) {
  const auto of = [](auto& c) -> schedule_fingerprint {
    if constexpr (requires { c.schedule(); }) {
      return c.schedule();
    } else {
      return {};
    }
  };
  std::vector<schedule_fingerprint> out;
  for (std::size_t a = 0; a < Mesh::axis_count; ++a) out.push_back(of(mesh.axis(a)));
  out.push_back(of(mesh.world()));
  return out;
}

// The two meshes are classes rather than alias templates: nvcc's host-code generator
// loses string-literal template arguments that pass through an alias template.
#if ZEST_HAS_MPI
// A mesh over MPI ranks.
template <fixed_string... Axes>
class mesh : public basic_mesh<mpi_communicator, Axes...> {
 public:
  using basic_mesh<mpi_communicator, Axes...>::basic_mesh;
};
#endif

// A mesh of one process, no MPI: every axis has size 1.
template <fixed_string... Axes>
class local_mesh : public basic_mesh<local_communicator, Axes...> {
 public:
  using basic_mesh<local_communicator, Axes...>::basic_mesh;
};

}  // namespace zest
