// zest/comm/mpi_datatype.hpp — zest element types and reductions as MPI handles.
//
//   mpi_datatype_of<float>()                 MPI_FLOAT
//   mpi_datatype_of<bfloat16>()              MPI_UINT16_T (the 16 bits travel unchanged)
//   mpi_datatype_of<float16>()               MPI_UINT16_T (likewise)
//   mpi_op_of<float>(reduce_op::max)         MPI_MAX
//   mpi_op_of<bfloat16>(reduce_op::sum)      a user-defined op that adds in float
//   mpi_op_of<float16>(reduce_op::sum)       another one, for float16
//
// MPI has neither bfloat16 nor a standard float16 (MPICH's MPIX_C_FLOAT16 is an extension),
// so both 16-bit floats move as their raw bits and reduce with three user-defined ops each
// (sum, max, min computed in float, rounded back per pair). The ops are created on first
// use and freed at MPI_Finalize by a delete callback on MPI_COMM_SELF, which MPI runs
// before it shuts down, so no handle outlives MPI and nothing crashes at exit.
#pragma once

#include <mpi.h>

#include <initializer_list>
#include <type_traits>

#include "zest/comm/communicator.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/float16.hpp"

namespace zest {

template <class T>
MPI_Datatype mpi_datatype_of() {
  constexpr dtype type = dtype_of<T>();  // static_asserts on unsupported types
  if constexpr (type == dtype::f32) return MPI_FLOAT;
  else if constexpr (type == dtype::f64) return MPI_DOUBLE;
  else if constexpr (type == dtype::bf16 || type == dtype::f16) return MPI_UINT16_T;
  else if constexpr (type == dtype::i32) return MPI_INT32_T;
  else if constexpr (type == dtype::i64) return MPI_INT64_T;
  else if constexpr (type == dtype::u8) return MPI_UINT8_T;
  else return MPI_UINT16_T;
}

namespace detail {

// The element types that MPI moves as 16 raw bits and reduces in float.
template <class T>
inline constexpr bool is_float_16bit_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// MPI hands user ops plain buffers of the datatype the collective was called with; for
// H (bfloat16 or float16) that is MPI_UINT16_T carrying H objects.
template <class H, class Combine>
void combine_16bit(const void* in, void* inout, const int* length, Combine combine) {
  const auto* a = static_cast<const H*>(in);
  auto* b = static_cast<H*>(inout);
  for (int i = 0; i < *length; ++i) {
    b[i] = H(combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}

template <class H>
void sum_16bit(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  combine_16bit<H>(in, inout, length, [](float x, float y) { return x + y; });
}
template <class H>
void max_16bit(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  combine_16bit<H>(in, inout, length, [](float x, float y) { return x < y ? y : x; });
}
template <class H>
void min_16bit(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  combine_16bit<H>(in, inout, length, [](float x, float y) { return y < x ? y : x; });
}

struct reduce_op_set {
  MPI_Op sum = MPI_OP_NULL;
  MPI_Op max = MPI_OP_NULL;
  MPI_Op min = MPI_OP_NULL;
};

// Runs inside MPI_Finalize (attributes of MPI_COMM_SELF are deleted first, while MPI still
// works), so the ops are released exactly once, by MPI's own shutdown.
inline int free_reduce_ops(MPI_Comm /*comm*/, int keyval, void* attribute, void* /*extra*/) {
  auto* ops = static_cast<reduce_op_set*>(attribute);
  for (MPI_Op* op : {&ops->sum, &ops->max, &ops->min}) {
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }
  MPI_Comm_free_keyval(&keyval);
  return MPI_SUCCESS;
}

template <class H>
void check_mpi_setup(int code, const char* what) {
  if (code != MPI_SUCCESS) {
    throw communicator_error(detail::message(
        "zest: ", name_of(dtype_of<H>()), " reduce ops: ", what, " failed with MPI error ", code));
  }
}

// The three ops of H, one set per type.
template <class H>
const reduce_op_set& float_16bit_ops() {
  static_assert(is_float_16bit_v<H>);
  // Function-local static: created once, after MPI_Init (first use is inside a collective).
  static reduce_op_set ops = [] {
    reduce_op_set created;
    constexpr int commutative = 1;
    check_mpi_setup<H>(MPI_Op_create(&sum_16bit<H>, commutative, &created.sum), "MPI_Op_create");
    check_mpi_setup<H>(MPI_Op_create(&max_16bit<H>, commutative, &created.max), "MPI_Op_create");
    check_mpi_setup<H>(MPI_Op_create(&min_16bit<H>, commutative, &created.min), "MPI_Op_create");
    return created;
  }();
  static const bool cleanup_registered = [] {
    int keyval = MPI_KEYVAL_INVALID;
    check_mpi_setup<H>(
        MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_reduce_ops, &keyval, nullptr),
        "MPI_Comm_create_keyval");
    check_mpi_setup<H>(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, &ops), "MPI_Comm_set_attr");
    return true;
  }();
  (void)cleanup_registered;
  return ops;
}

}  // namespace detail

template <class T>
MPI_Op mpi_op_of(reduce_op op) {
  if constexpr (detail::is_float_16bit_v<T>) {
    const auto& ops = detail::float_16bit_ops<T>();
    switch (op) {
      case reduce_op::sum: return ops.sum;
      case reduce_op::max: return ops.max;
      case reduce_op::min: return ops.min;
    }
  } else {
    switch (op) {
      case reduce_op::sum: return MPI_SUM;
      case reduce_op::max: return MPI_MAX;
      case reduce_op::min: return MPI_MIN;
    }
  }
  throw communicator_error("zest: unknown reduce_op");
}

}  // namespace zest
