// expect-compiles
// The harness's own check: with the flags the compile_fail tests use, a correct program
// that includes the umbrella header compiles. If this fails, every other case is suspect.
#include <zest/zest.hpp>

static_assert(zest::dtype_of<float>() == zest::dtype::f32);

int main() { return 0; }
