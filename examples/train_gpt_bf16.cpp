// train_gpt_bf16.cpp — train_gpt's CPU runs under --precision bf16, all four ZeRO stages. main()
// is in train_gpt.cpp; each precision is a translation unit of its own, so that the build
// compiles the three in parallel and no one compile holds all twelve training policies
// (bench/README.md, "Compile time and memory").
#include "train_gpt.hpp"

namespace train_gpt_example {
template int train_with_precision<cpu_mesh, zest::bfloat16>(const flags&, const cpu_mesh&,
                                                            const zest::text_dataset&);
}  // namespace train_gpt_example
