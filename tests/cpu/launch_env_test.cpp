// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tpcomm/bootstrap.hpp"
#include "tpcomm/status.hpp"

namespace tpcomm {
namespace {

using Env = std::map<std::string, std::string>;

LaunchInfo detect(const Env& env) {
  return detect_launch([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

struct Recognised {
  const char* what;
  Env env;
  LaunchInfo expected;
};

TEST(DetectLaunch, RecognisesEveryLauncher) {
  const Recognised cases[] = {
      {"nothing", {}, {0, 1, -1, -1, "127.0.0.1", 0, "single"}},
      {"explicit",
       {{"TPCOMM_RANK", "3"},
        {"TPCOMM_WORLD_SIZE", "8"},
        {"TPCOMM_LOCAL_RANK", "1"},
        {"TPCOMM_LOCAL_WORLD_SIZE", "2"},
        {"TPCOMM_STORE_ADDR", "node0:29500"}},
       {3, 8, 1, 2, "node0", 29500, "explicit"}},
      {"explicit with an IPv6 store",
       {{"TPCOMM_RANK", "0"}, {"TPCOMM_WORLD_SIZE", "2"}, {"TPCOMM_STORE_ADDR", "[::1]:1234"}},
       {0, 2, -1, -1, "::1", 1234, "explicit"}},
      {"explicit wins over torchrun",
       {{"TPCOMM_RANK", "1"},
        {"TPCOMM_WORLD_SIZE", "2"},
        {"RANK", "0"},
        {"WORLD_SIZE", "4"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "29500"}},
       {1, 2, -1, -1, "10.0.0.1", 29500, "explicit"}},
      {"torchrun",
       {{"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "29500"},
        {"OMPI_COMM_WORLD_RANK", "0"},
        {"OMPI_COMM_WORLD_SIZE", "1"}},
       {5, 8, 1, 4, "10.0.0.1", 29500, "torchrun"}},
      {"torchrun whose agent serves its store on MASTER_PORT: the next port",
       {{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", "29500"},
        {"TORCHELASTIC_USE_AGENT_STORE", "True"}},
       {1, 2, -1, -1, "127.0.0.1", 29501, "torchrun"}},
      {"an agent store and TPCOMM_STORE_ADDR: the explicit address",
       {{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", "29500"},
        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
        {"TPCOMM_STORE_ADDR", "127.0.0.1:29700"}},
       {1, 2, -1, -1, "127.0.0.1", 29700, "torchrun"}},
      {"torchrun with TPCOMM_STORE_ADDR overriding MASTER_*",
       {{"RANK", "0"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "29500"},
        {"TPCOMM_STORE_ADDR", "127.0.0.1:29600"}},
       {0, 2, -1, -1, "127.0.0.1", 29600, "torchrun"}},
      {"open mpi",
       {{"OMPI_COMM_WORLD_RANK", "2"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
        {"MASTER_ADDR", "head"},
        {"MASTER_PORT", "4000"},
        {"PMI_RANK", "9"},
        {"SLURM_PROCID", "9"}},
       {2, 4, 0, 2, "head", 4000, "ompi"}},
      {"pmi without a local size",
       {{"PMI_RANK", "1"},
        {"PMI_SIZE", "2"},
        {"MPI_LOCALRANKID", "1"},
        {"TPCOMM_STORE_ADDR", "head:4000"}},
       {1, 2, 1, -1, "head", 4000, "pmi"}},
      {"slurm",
       {{"SLURM_PROCID", "7"},
        {"SLURM_NTASKS", "16"},
        {"SLURM_LOCALID", "3"},
        {"SLURM_NTASKS_PER_NODE", "8"},
        {"MASTER_ADDR", "gpu-001"},
        {"MASTER_PORT", "29500"}},
       {7, 16, 3, 8, "gpu-001", 29500, "slurm"}},
      {"one-rank mpi job needs no address",
       {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}},
       {0, 1, -1, -1, "127.0.0.1", 0, "ompi"}},
      {"empty values count as unset",
       {{"RANK", ""}, {"WORLD_SIZE", ""}},
       {0, 1, -1, -1, "127.0.0.1", 0, "single"}},
  };
  for (const Recognised& c : cases) {
    SCOPED_TRACE(c.what);
    LaunchInfo got = detect(c.env);
    EXPECT_EQ(got.source, c.expected.source);
    EXPECT_EQ(got.rank, c.expected.rank);
    EXPECT_EQ(got.world_size, c.expected.world_size);
    EXPECT_EQ(got.local_rank, c.expected.local_rank);
    EXPECT_EQ(got.local_world_size, c.expected.local_world_size);
    EXPECT_EQ(got.store_host, c.expected.store_host);
    EXPECT_EQ(got.store_port, c.expected.store_port);
  }
}

struct Malformed {
  Env env;
  const char* needle;  // what the message must name
};

TEST(DetectLaunch, RejectsMalformedEnvironments) {
  const Env torchrun{
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto with = [&](Env extra) {
    Env e = torchrun;
    for (auto& [k, v] : extra) e[k] = v;
    return e;
  };
  const Malformed cases[] = {
      {with({{"RANK", "2"}}), "RANK=2 is out of range"},
      {with({{"RANK", "-1"}}), "RANK=\"-1\""},
      {with({{"RANK", "one"}}), "RANK=\"one\""},
      {with({{"RANK", "1x"}}), "RANK=\"1x\""},
      {with({{"WORLD_SIZE", "0"}}), "WORLD_SIZE=\"0\""},
      {with({{"WORLD_SIZE", "99999999999"}}), "WORLD_SIZE"},
      {with({{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}), "LOCAL_RANK=2 is out of range"},
      {with({{"LOCAL_WORLD_SIZE", "3"}}), "LOCAL_WORLD_SIZE=3 is larger than WORLD_SIZE=2"},
      {with({{"MASTER_PORT", "0"}}), "MASTER_PORT=\"0\""},
      {with({{"MASTER_PORT", "65536"}}), "MASTER_PORT=\"65536\""},
      {with({{"MASTER_PORT", "http"}}), "MASTER_PORT=\"http\""},
      {with({{"MASTER_PORT", "65535"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}}),
       "set TPCOMM_STORE_ADDR"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, "MASTER_PORT is not"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}, "MASTER_ADDR is not"},
      {{{"RANK", "0"}}, "WORLD_SIZE is not set"},
      {{{"TPCOMM_WORLD_SIZE", "2"}}, "TPCOMM_RANK is not set"},
      {{{"TPCOMM_RANK", "0"}, {"TPCOMM_WORLD_SIZE", "2"}, {"TPCOMM_STORE_ADDR", "nohost"}},
       "TPCOMM_STORE_ADDR=\"nohost\""},
      {{{"TPCOMM_RANK", "0"}, {"TPCOMM_WORLD_SIZE", "2"}, {"TPCOMM_STORE_ADDR", ":80"}},
       "TPCOMM_STORE_ADDR"},
      {{{"TPCOMM_RANK", "0"}, {"TPCOMM_WORLD_SIZE", "2"}, {"TPCOMM_STORE_ADDR", "::1:80"}},
       "brackets"},
      {{{"TPCOMM_RANK", "0"}, {"TPCOMM_WORLD_SIZE", "2"}, {"TPCOMM_STORE_ADDR", "h:99999"}},
       "TPCOMM_STORE_ADDR=\"h:99999\""},
      {{{"TPCOMM_RANK", "0"}, {"TPCOMM_WORLD_SIZE", "2"}}, "TPCOMM_STORE_ADDR"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
       "set MASTER_ADDR and MASTER_PORT"},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}, "set MASTER_ADDR and MASTER_PORT"},
      {{{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "4"},
        {"TPCOMM_STORE_ADDR", "h:1"},
        {"SLURM_LOCALID", "x"}},
       "SLURM_LOCALID=\"x\""},
      {{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"TPCOMM_STORE_ADDR", "h:1"}},
       "SLURM_PROCID=4 is out of range: SLURM_NTASKS is 4"},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.needle);
    try {
      LaunchInfo info = detect(c.env);
      ADD_FAILURE() << "accepted (source " << info.source << ", rank " << info.rank << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tpcomm
