// zest/tensor/wire_codec.hpp — int8 blocks with fp32 scales (zest/layout/wire.hpp): the loop
// bodies that encode a tensor's part for the wire and decode it, run by every backend's
// for_each (host loops, CUDA kernels).
//
//   Backend::for_each(blocks, detail::encode_blocks_fn<T>{src, count, block, wire});
//   Backend::for_each(count, detail::decode_fn<T>{wire, count, block, dst});
//   Backend::for_each(count, detail::decode_sum_fn<T>{wire, stride, parts, count, block, dst});
//
// One part on the wire: ceil(count / block) fp32 scales, then count int8 bytes (padded to 4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "zest/config.hpp"
#include "zest/core/device_math.hpp"

namespace zest::detail {

// Where the int8 bytes of a part of `count` elements start (after its scales).
ZEST_HOST_DEVICE constexpr std::size_t wire_payload_at(std::size_t count, std::size_t block) {
  return 4 * ((count + block - 1) / block);
}

// Block b of src[0, count) -> its scale and its bytes in `wire` (the part's start).
template <class T>
struct encode_blocks_fn {
  using prebuilt_element = T;  // a CUDA program may build this kernel once (zest/cuda_kernels.cu)
  const T* src;
  std::size_t count, block;
  std::uint8_t* wire;
  ZEST_HOST_DEVICE void operator()(std::size_t b) const {
    const std::size_t first = b * block;
    const std::size_t last = first + block < count ? first + block : count;
    float largest = 0;
    bool finite = true;
    for (std::size_t i = first; i < last; ++i) {
      const auto x = static_cast<float>(src[i]);
      const float a = x < 0 ? -x : x;
      if (!dmath::isfinite(a)) finite = false;
      else if (a > largest) largest = a;
    }
    // A NaN or an infinity makes the block's scale NaN (its bytes 0): it decodes to NaN
    // throughout. The bytes are x / largest * 127, which cannot overflow however small the
    // block's values (a scale below 1e-38 is a denormal, and 127 / largest would be inf).
    float scale = largest / 127.0F;
    if (!finite) {
      const std::uint32_t quiet_nan = 0x7fc00000U;
      std::memcpy(&scale, &quiet_nan, sizeof scale);
    }
    std::memcpy(wire + 4 * b, &scale, sizeof scale);
    std::uint8_t* bytes = wire + wire_payload_at(count, block);
    for (std::size_t i = first; i < last; ++i) {
      float q = 0;
      if (finite && largest > 0) {
        q = dmath::floor(static_cast<float>(src[i]) / largest * 127.0F + 0.5F);
        q = q > 127.0F ? 127.0F : (q < -127.0F ? -127.0F : q);
      }
      bytes[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
    }
  }
};

ZEST_HOST_DEVICE inline float wire_value(const std::uint8_t* wire, std::size_t count,
                                         std::size_t block, std::size_t i) {
  float scale = 0;
  std::memcpy(&scale, wire + 4 * (i / block), sizeof scale);
  const auto q = static_cast<std::int8_t>(wire[wire_payload_at(count, block) + i]);
  return static_cast<float>(q) * scale;
}

// Element i of a part of `count` elements, decoded.
template <class T>
struct decode_fn {
  using prebuilt_element = T;  // a CUDA program may build this kernel once (zest/cuda_kernels.cu)
  const std::uint8_t* wire;
  std::size_t count, block;
  T* dst;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    dst[i] = static_cast<T>(wire_value(wire, count, block, i));
  }
};

// Element i of `parts` parts of the same shape, `stride` bytes apart: decoded and summed in
// fp32 in part order, rounded once.
template <class T>
struct decode_sum_fn {
  using prebuilt_element = T;  // a CUDA program may build this kernel once (zest/cuda_kernels.cu)
  const std::uint8_t* wire;
  std::size_t stride, parts, count, block;
  T* dst;
  ZEST_HOST_DEVICE void operator()(std::size_t i) const {
    float sum = 0;
    for (std::size_t c = 0; c < parts; ++c) sum += wire_value(wire + c * stride, count, block, i);
    dst[i] = static_cast<T>(sum);
  }
};

}  // namespace zest::detail
