// SPDX-License-Identifier: Apache-2.0
// The NCCL loader against the real libnccl.so.2 of this machine, against paths that are not
// NCCL, and against fake NCCL libraries of old versions (tests/support/fake_nccl.cpp).
#include "backends/nccl_lib.hpp"

#include <gtest/gtest.h>

#include <iostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tpcomm/status.hpp"

namespace tpcomm {
namespace {

/// The system NCCL, or nullptr (and the test is skipped) where none is installed.
const NcclLib* system_nccl() {
  std::string why;
  const NcclLib* lib = NcclLib::try_load("libnccl.so.2", &why);
  if (lib == nullptr) std::cerr << "no system NCCL: " << why << "\n";
  return lib;
}

/// Loads `path`, expecting `Error(kUnavailable)`; returns its message.
std::string load_error(const std::string& path) {
  try {
    (void)NcclLib::load(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kUnavailable) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "loading " << path << " succeeded";
  return {};
}

TEST(NcclLib, LoadsTheSystemNcclWithEveryRequiredSymbol) {
  const NcclLib* lib = system_nccl();
  if (lib == nullptr) GTEST_SKIP() << "libnccl.so.2 is not installed";
#define TPCOMM_EXPECT_RESOLVED(name) EXPECT_NE(lib->name, nullptr) << #name;
  TPCOMM_NCCL_REQUIRED_SYMBOLS(TPCOMM_EXPECT_RESOLVED)
#undef TPCOMM_EXPECT_RESOLVED
  EXPECT_GE(lib->version(), NcclLib::kMinVersion);
  // Same major version as the headers tpcomm is built against (the ABI tpcomm assumes).
  EXPECT_EQ(lib->version() / 10000, NCCL_MAJOR) << lib->version_string();
  EXPECT_TRUE(std::regex_match(lib->version_string(), std::regex(R"(\d+\.\d+\.\d+)")))
      << lib->version_string();
  EXPECT_EQ(lib->path(), "libnccl.so.2");
  EXPECT_NE(lib->resolved_path().find("nccl"), std::string::npos) << lib->resolved_path();
  EXPECT_EQ(lib->has_window_register,
            lib->ncclCommWindowRegister != nullptr && lib->ncclCommWindowDeregister != nullptr);
  EXPECT_EQ(lib->has_mem_alloc, lib->ncclMemAlloc != nullptr && lib->ncclMemFree != nullptr);
  EXPECT_EQ(lib->has_comm_finalize, lib->ncclCommFinalize != nullptr);
  EXPECT_EQ(lib->has_all_to_all, lib->ncclAlltoAll != nullptr);
  // Features of the versions that introduced them.
  EXPECT_TRUE(lib->version() < 21900 || lib->has_mem_alloc);
  EXPECT_TRUE(lib->version() < 22700 || lib->has_window_register);
  EXPECT_TRUE(lib->version() < 22800 || lib->has_all_to_all);
}

TEST(NcclLib, LoadsOncePerPathFromManyThreads) {
  if (system_nccl() == nullptr) GTEST_SKIP() << "libnccl.so.2 is not installed";
  std::vector<const NcclLib*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&seen, i] { seen[i] = &NcclLib::load("libnccl.so.2"); });
  }
  for (auto& t : threads) t.join();
  for (const NcclLib* lib : seen) EXPECT_EQ(lib, system_nccl());
}

TEST(NcclLib, MapsEveryDTypeAndOp) {
  const NcclLib* lib = system_nccl();
  if (lib == nullptr) GTEST_SKIP() << "libnccl.so.2 is not installed";
  EXPECT_EQ(lib->to_nccl(DType::kF32), ncclFloat32);
  EXPECT_EQ(lib->to_nccl(DType::kF16), ncclFloat16);
  EXPECT_EQ(lib->to_nccl(DType::kBF16), ncclBfloat16);
  EXPECT_EQ(lib->to_nccl(DType::kF64), ncclFloat64);
  EXPECT_EQ(lib->to_nccl(DType::kI8), ncclInt8);
  EXPECT_EQ(lib->to_nccl(DType::kU8), ncclUint8);
  EXPECT_EQ(lib->to_nccl(DType::kI32), ncclInt32);
  EXPECT_EQ(lib->to_nccl(DType::kU32), ncclUint32);
  EXPECT_EQ(lib->to_nccl(DType::kI64), ncclInt64);
  EXPECT_EQ(lib->to_nccl(DType::kU64), ncclUint64);
  if (lib->version() >= NcclLib::kFp8Version) {
    EXPECT_TRUE(lib->supports_fp8());
    EXPECT_EQ(lib->to_nccl(DType::kF8E4M3), ncclFloat8e4m3);
    EXPECT_EQ(lib->to_nccl(DType::kF8E5M2), ncclFloat8e5m2);
  } else {
    EXPECT_EQ(lib->to_nccl(DType::kF8E4M3), std::nullopt);
  }
  EXPECT_EQ(NcclLib::to_nccl(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(NcclLib::to_nccl(ReduceOp::kProd), ncclProd);
  EXPECT_EQ(NcclLib::to_nccl(ReduceOp::kMax), ncclMax);
  EXPECT_EQ(NcclLib::to_nccl(ReduceOp::kMin), ncclMin);
  EXPECT_EQ(NcclLib::to_nccl(ReduceOp::kAvg), ncclAvg);
}

TEST(NcclLib, ErrorStringNamesTheResultAndNcclsText) {
  const NcclLib* lib = system_nccl();
  if (lib == nullptr) GTEST_SKIP() << "libnccl.so.2 is not installed";
  const std::string s = lib->error_string(ncclInvalidArgument);
  EXPECT_EQ(s.rfind("ncclInvalidArgument: ", 0), 0u) << s;
  EXPECT_NE(s.find("invalid argument"), std::string::npos) << s;
  EXPECT_EQ(NcclLib::result_name(ncclInProgress), "ncclInProgress");
  EXPECT_EQ(NcclLib::result_name(static_cast<ncclResult_t>(99)), "");
}

TEST(NcclLib, FormatsVersionCodes) {
  EXPECT_EQ(NcclLib::version_string(22809), "2.28.9");
  EXPECT_EQ(NcclLib::version_string(21800), "2.18.0");
  EXPECT_EQ(NcclLib::version_string(22401), "2.24.1");
  // NCCL up to 2.8 encoded versions as major * 1000 + minor * 100 + patch.
  EXPECT_EQ(NcclLib::version_string(2804), "2.8.4");
  EXPECT_EQ(NcclLib::version_string(30001), "3.0.1");
}

TEST(NcclLib, MissingLibraryIsAClearErrorNamingThePath) {
  const std::string path = "/nonexistent/tpcomm/libnccl.so.2";
  const std::string message = load_error(path);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("TPCOMM_NCCL_PATH"), std::string::npos) << message;
  std::string why;
  EXPECT_EQ(NcclLib::try_load(path, &why), nullptr);
  EXPECT_NE(why.find(path), std::string::npos) << why;
  // Not cached: the same answer again, no crash.
  EXPECT_EQ(NcclLib::try_load(path), nullptr);
}

TEST(NcclLib, LibraryThatIsNotNcclIsAClearError) {
  const std::string message = load_error("libc.so.6");
  EXPECT_NE(message.find("libc.so.6"), std::string::npos) << message;
  EXPECT_NE(message.find("ncclGetVersion"), std::string::npos) << message;
}

TEST(NcclLib, RefusesVersionsBeforeTheMinimum) {
  const std::string message = load_error(TPCOMM_FAKE_NCCL_2_17);
  EXPECT_NE(message.find("2.17.0"), std::string::npos) << message;
  EXPECT_NE(message.find("2.18.0"), std::string::npos) << message;
}

TEST(NcclLib, OlderSupportedVersionHasNoFp8NorOptionalEntryPoints) {
  const NcclLib& lib = NcclLib::load(TPCOMM_FAKE_NCCL_2_23);
  EXPECT_EQ(lib.version(), 22300);
  EXPECT_EQ(lib.version_string(), "2.23.0");
  EXPECT_FALSE(lib.has_window_register);
  EXPECT_FALSE(lib.has_mem_alloc);
  EXPECT_FALSE(lib.has_comm_finalize);
  EXPECT_FALSE(lib.has_all_to_all);
  EXPECT_EQ(lib.ncclAlltoAll, nullptr);
  EXPECT_FALSE(lib.supports_fp8());
  EXPECT_EQ(lib.to_nccl(DType::kF8E4M3), std::nullopt);
  EXPECT_EQ(lib.to_nccl(DType::kF8E5M2), std::nullopt);
  EXPECT_EQ(lib.to_nccl(DType::kBF16), ncclBfloat16);
  const std::string s = lib.error_string(ncclSystemError);
  EXPECT_EQ(s, "ncclSystemError: fake NCCL error") << s;
}

}  // namespace
}  // namespace tpcomm
