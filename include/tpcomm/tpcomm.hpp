// SPDX-License-Identifier: Apache-2.0
// Everything a user of tpcomm includes.
#pragma once

#include "tpcomm/bootstrap.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/lm_head.hpp"
#include "tpcomm/moe.hpp"
#include "tpcomm/norm.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/parallel_config.hpp"
#include "tpcomm/parallel_groups.hpp"
#include "tpcomm/policy.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/store.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/types.hpp"
