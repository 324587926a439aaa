// SPDX-License-Identifier: Apache-2.0
#include "tools/ranks.hpp"

#include <cuda_runtime.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <thread>

#include "bootstrap/launcher.hpp"
#include "core/cuda_check.hpp"
#include "core/shared_gpu.hpp"

namespace tpcomm::tools {
namespace {

constexpr const char* kChildVariable = "TPCOMM_LAUNCHED_CHILD";

/// This program's arguments without `-g N` / `--ngpus N`, for the children it launches.
std::vector<std::string> relaunch_args() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string a; std::getline(f, a, '\0');) args.push_back(a);
  std::vector<std::string> out{"/proc/self/exe"};
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-g" || a == "--ngpus") {
      ++i;
      continue;
    }
    if ((a.rfind("-g", 0) == 0 && a.size() > 2 && std::isdigit(static_cast<unsigned char>(a[2]))) ||
        a.rfind("--ngpus=", 0) == 0)
      continue;
    out.push_back(a);
  }
  return out;
}

}  // namespace

std::string rank_mode(const RankPlan& plan) {
  if (plan.virtual_ranks > 0) return "virtual ranks: threads on GPU 0";
  if (std::getenv(kChildVariable) != nullptr) return "one process per GPU";
  return "launcher";
}

int for_each_rank(const RankPlan& plan, const std::function<int(Bootstrap&, int)>& body) {
  if (plan.virtual_ranks > 0) set_shared_gpu_environment();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device here: nothing to run\n");
    return 77;
  }
  if (plan.gpus > 0 && std::getenv(kChildVariable) == nullptr) {
    LaunchSpec spec;
    spec.nprocs = plan.gpus;
    spec.argv = relaunch_args();
    spec.timeout = std::chrono::seconds(plan.timeout_s);
    spec.env = plan.child_env;
    spec.env.emplace_back(kChildVariable, "1");
    LaunchResult r = launch_local(spec);
    if (r.exit_code != 0) std::fprintf(stderr, "tpcomm: %s\n", r.message.c_str());
    return r.exit_code;
  }
  if (plan.virtual_ranks > 0) {
    auto boots =
        Bootstrap::in_process(plan.virtual_ranks, Milliseconds(Options::from_env().timeout_ms));
    std::vector<int> codes(static_cast<std::size_t>(plan.virtual_ranks), 0);
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(plan.virtual_ranks));
    std::mutex m;
    for (int r = 0; r < plan.virtual_ranks; ++r) {
      threads.emplace_back([&, r] {
        try {
          TPCOMM_CUDA_CHECK(cudaSetDevice(0));
          codes[static_cast<std::size_t>(r)] = body(boots[static_cast<std::size_t>(r)], 0);
        } catch (const std::exception& e) {
          std::lock_guard lock(m);
          std::fprintf(stderr, "tpcomm: rank %d: %s\n", r, e.what());
          codes[static_cast<std::size_t>(r)] = 1;
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int c : codes)
      if (c != 0) return c;
    return 0;
  }
  Bootstrap boot = Bootstrap::from_env();
  const int device = (boot.local_rank() < 0 ? 0 : boot.local_rank()) % devices;
  TPCOMM_CUDA_CHECK(cudaSetDevice(device));
  return body(boot, device);
}

bool ranks_share_gpu(Bootstrap& boot, int device) {
  char bus[32] = {};
  cudaDeviceGetPCIBusId(bus, sizeof(bus), device);
  struct Id {
    std::int32_t node;
    char bus[32];
  } id{boot.node_id(), {}};
  std::memcpy(id.bus, bus, sizeof(bus));
  auto ids = boot.all_gather_value(id);
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (ids[i].node == ids[j].node && std::strcmp(ids[i].bus, ids[j].bus) == 0) return true;
  return false;
}

}  // namespace tpcomm::tools
