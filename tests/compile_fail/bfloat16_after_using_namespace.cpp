// expect-compiles
// A user program that includes the umbrella header, writes `using namespace zest;` and then
// names bfloat16 unqualified, as the README's examples do. With ZEST_HAS_BLAS=1 this must
// still mean zest::bfloat16 (OpenBLAS's <cblas.h> has a global typedef of the same name).
#include <zest/zest.hpp>

using namespace zest;

static_assert(sizeof(bfloat16) == 2);

int main() {
  const bfloat16 x = 1.5F;
  return static_cast<float>(x) == 1.5F ? 0 : 1;
}
