// A user's program: includes the umbrella header, uses a few things, exits 0 when they work.
#include <zest/zest.hpp>

#include <cstdio>

template <zest::fixed_string Axis>
struct axis_name {
  static constexpr std::string_view value = zest::view_of<Axis>;
};

int main() {
  static_assert(axis_name<"dp">::value == "dp");
  static_assert(zest::dtype_of<zest::bfloat16>() == zest::dtype::bf16);
  const zest::bfloat16 x(1.5F);
  const bool ok = static_cast<float>(x) == 1.5F && ZEST_HAS_MPI == 1;
  std::printf("zest consumer: %s (ZEST_HAS_BLAS=%d)\n", ok ? "OK" : "FAIL", ZEST_HAS_BLAS);
  return ok ? 0 : 1;
}
