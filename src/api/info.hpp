// SPDX-License-Identifier: Apache-2.0
// The report of `tpcomm info`, shared by the program and the C API (`tpcomm_info`).
#pragma once

#include <string>

namespace tpcomm {

/// How tpcomm was built, the driver, GPUs, peer access and NVLink, NCCL, the usable backends,
/// the algorithms and the knobs, as text or as one JSON object (the same sections). Runs on a
/// machine without a driver, GPU or NCCL (each section then says why it is empty).
/// `invalid_knobs` (optional) receives the number of `TPCOMM_*` variables that could not be
/// parsed; each is listed in the report and shown at its default. Throws only on exhausted
/// memory.
std::string info_report(bool as_json, int* invalid_knobs = nullptr);

}  // namespace tpcomm
