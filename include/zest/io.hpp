// zest/io.hpp — the umbrella of checkpoints: sharded tensors saved and loaded onto any mesh,
// a training run's state, and the JSON their manifests and metadata are written in.
//
//   #include <zest/io.hpp>
//   zest::save_training_state("ckpt", engine, step, config);        // collective
//   auto info = zest::load_training_state("ckpt", engine);           // another mesh or stage
//
// Apart from zest/zest.hpp, so that a program without checkpoints compiles no JSON parser.
#pragma once

#include "zest/zest.hpp"

#include "zest/core/files.hpp"
#include "zest/core/json.hpp"

#include "zest/io/checkpoint.hpp"
#include "zest/io/checksum.hpp"
#include "zest/io/manifest.hpp"
#include "zest/io/safetensors.hpp"
#include "zest/io/tensor_record.hpp"

#include "zest/nn/gpt_weights.hpp"
#include "zest/train/checkpoint.hpp"
#include "zest/train/weights.hpp"
