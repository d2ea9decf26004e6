// train_gpt_llama_fp16.cpp — train_gpt's CPU runs of --arch llama in fp16, all four ZeRO
// stages: a translation unit of its own, as train_gpt_fp16.cpp is for --arch gpt, so that no
// one compile holds more than one precision's four training policies.
#include "train_gpt_llama.hpp"

namespace train_gpt_example {
template int train_with_precision<cpu_mesh, zest::float16, llama_arch>(const flags&,
                                                                       const cpu_mesh&,
                                                                       const zest::text_dataset&);
}  // namespace train_gpt_example
