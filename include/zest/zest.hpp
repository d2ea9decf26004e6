// zest/zest.hpp — the umbrella header: everything a user program needs.
#pragma once

#include "zest/config.hpp"
#include "zest/core/bfloat16.hpp"
#include "zest/core/dtype.hpp"
#include "zest/core/error.hpp"
#include "zest/core/fixed_string.hpp"
#include "zest/comm/checked.hpp"
#include "zest/comm/communicator.hpp"
