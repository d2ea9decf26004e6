// train_gpt_llama_bf16.cpp — train_gpt's CPU runs of --arch llama in bf16, all four ZeRO
// stages: a translation unit of its own, as train_gpt_bf16.cpp is for --arch gpt, so that no
// one compile holds more than one precision's four training policies.
#include "train_gpt_llama.hpp"

namespace train_gpt_example {
template int train_with_precision<cpu_mesh, zest::bfloat16, llama_arch>(const flags&,
                                                                        const cpu_mesh&,
                                                                        const zest::text_dataset&);
}  // namespace train_gpt_example
