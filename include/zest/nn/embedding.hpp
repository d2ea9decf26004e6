// zest/nn/embedding.hpp — a lookup table: ids "bt" -> vectors "btm".
#pragma once

#include <string>

#include "zest/autodiff/ops.hpp"
#include "zest/zero/parameter.hpp"

namespace zest {

// Table "vm" (rows, width). The output has the ids' dims and 'm'.
template <training_policy_type P, class Base = layout<>>
class embedding_layer {
 public:
  using parameter_type = parameter<P, "vm", Base>;

  embedding_layer(zero_engine<P>& engine, const std::string& name, std::size_t rows,
                  std::size_t width, double init_std = 0.02)
      : table_(engine, name, {rows, width}, init::normal{init_std}) {}

  template <fixed_string OutDims, sharded_tensor Ids>
  auto lookup(const Ids& ids) const {
    return autodiff::embedding<OutDims>(ids, table_.value());
  }

  const parameter_type& table() const { return table_; }

 private:
  parameter_type table_;
};

}  // namespace zest
