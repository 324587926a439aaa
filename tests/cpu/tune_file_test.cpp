// SPDX-License-Identifier: Apache-2.0
// The tune file (src/tune/table_file.cpp): saving and loading a table, and where it lives.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/child.hpp"
#include "support/tune_tables.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/status.hpp"
#include "tune/table.hpp"

namespace tpcomm {
namespace {

namespace fs = std::filesystem;

using testing::expect_error;
using testing::h200_key;
using testing::kGoodHead;
using testing::kKiB;
using testing::kMiB;
using testing::numbered_table;

// ---------------------------------------------------------------------------------------------
// Files

class TuneFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "tpcomm-tune-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void write(const fs::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary);
    out << text;
  }
  fs::path dir_;
};

TEST_F(TuneFile, SaveAndLoadRoundTrip) {
  const TuneTable t = numbered_table(8 * kMiB);
  const fs::path path = dir_ / "nested" / "deeper" / "tune.txt";
  t.save(path.string());  // creates the parent directories
  EXPECT_EQ(read(path), t.to_text());
  std::string why = "unchanged";
  auto back = TuneTable::load(path.string(), h200_key(), &why);
  ASSERT_TRUE(back.has_value()) << why;
  EXPECT_EQ(*back, t);
  EXPECT_EQ(why, "unchanged");
  // No temporary file is left behind, and the file is readable like any other.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(path.parent_path())) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "tune.txt");
  }
  EXPECT_EQ(files, 1);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST_F(TuneFile, SaveReplacesAnExistingFile) {
  const fs::path path = dir_ / "tune.txt";
  write(path, "old contents\n");
  const TuneTable t = numbered_table(4096);
  t.save(path.string());
  EXPECT_EQ(read(path), t.to_text());
  const TuneTable u = numbered_table(1 * kMiB);
  u.save(path.string());
  EXPECT_EQ(*TuneTable::load(path.string(), h200_key(), nullptr), u);
}

TEST_F(TuneFile, SaveInTheCurrentDirectoryNeedsNoParent) {
  const fs::path old = fs::current_path();
  fs::current_path(dir_);
  numbered_table(4096).save("relative.txt");
  fs::current_path(old);
  EXPECT_TRUE(fs::exists(dir_ / "relative.txt"));
}

TEST_F(TuneFile, KeyMismatchIsIgnoredWithAReasonNamingTheField) {
  const fs::path path = dir_ / "tune.txt";
  numbered_table(4096).save(path.string());
  TuneKey expected = h200_key();
  expected.world_size = 4;
  std::string why;
  EXPECT_FALSE(TuneTable::load(path.string(), expected, &why).has_value());
  EXPECT_EQ(why, "key differs: world_size 8 != 4");
  expected.tpcomm_version = "0.2.0";
  EXPECT_FALSE(TuneTable::load(path.string(), expected, &why).has_value());
  EXPECT_EQ(why, "key differs: world_size 8 != 4, tpcomm_version 0.1.0 != 0.2.0");
  EXPECT_FALSE(TuneTable::load(path.string(), expected, nullptr).has_value());
}

TEST_F(TuneFile, MissingMalformedAndUnreadableFiles) {
  std::string why;
  EXPECT_FALSE(TuneTable::load((dir_ / "absent.txt").string(), h200_key(), &why).has_value());
  EXPECT_EQ(why, "no such file");

  const fs::path bad = dir_ / "bad.txt";
  write(bad, kGoodHead + "512 one_shot 1 512\n");
  EXPECT_FALSE(TuneTable::load(bad.string(), h200_key(), &why).has_value());
  EXPECT_EQ(why.rfind("malformed: line 3: expected 5 fields", 0), 0u) << why;

  write(bad, "");
  EXPECT_FALSE(TuneTable::load(bad.string(), h200_key(), &why).has_value());
  EXPECT_EQ(why.rfind("malformed: line 1", 0), 0u) << why;

  // A directory is refused before it is opened.
  EXPECT_FALSE(TuneTable::load(dir_.string(), h200_key(), &why).has_value());
  EXPECT_EQ(why, "not a regular file (a directory)");

  // Something far larger than any table is refused without parsing it.
  write(bad, kGoodHead + std::string(std::size_t{2} << 20, '#'));
  EXPECT_FALSE(TuneTable::load(bad.string(), h200_key(), &why).has_value());
  EXPECT_EQ(why, "larger than 1 MiB");
}

TEST_F(TuneFile, SaveFailuresThrowSystemErrors) {
  const TuneTable t = numbered_table(4096);
  const fs::path file = dir_ / "plain-file";
  write(file, "x");
  // A regular file where a directory must be.
  expect_error([&] { t.save((file / "tune.txt").string()); }, Status::kSystemError,
               "cannot create directory");
  // A directory where the file must go: rename cannot replace it.
  fs::create_directory(dir_ / "occupied");
  fs::create_directory(dir_ / "occupied" / "inner");
  expect_error([&] { t.save((dir_ / "occupied").string()); }, Status::kSystemError,
               "not a regular file");
  expect_error([&] { t.save(""); }, Status::kSystemError, "not a file path");
  expect_error([&] { t.save((dir_ / "ends-in-slash/").string()); }, Status::kSystemError,
               "not a file path");
  // The failed rename left no temporary file.
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_NE(entry.path().filename().string().front(), '.') << entry.path();
}

// Loading a FIFO with no writer must not block: open() of a FIFO waits for a writer.
TEST_F(TuneFile, LoadRefusesAFifoWithoutBlocking) {
  const fs::path fifo = dir_ / "fifo.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const pid_t pid = testing::fork_child([&] {
    std::string why;
    if (TuneTable::load(fifo.string(), h200_key(), &why).has_value())
      throw std::runtime_error("a FIFO was loaded");
    if (why != "not a regular file (a FIFO)") throw std::runtime_error("reason: " + why);
  });
  EXPECT_EQ(testing::wait_child(pid, std::chrono::seconds(5)), 0)
      << "load blocked on the FIFO (-1) or gave the wrong reason (1)";
}

// A save replaces a directory entry by rename(); a device node, a FIFO or a directory there is
// refused instead, and left as it was.
TEST_F(TuneFile, SaveRefusesATargetThatIsNotARegularFile) {
  const TuneTable t = numbered_table(4096);
  const fs::path fifo = dir_ / "fifo.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const pid_t pid = testing::fork_child([&] {
    try {
      t.save(fifo.string());
    } catch (const Error& e) {
      if (std::string(e.what()).find("not a regular file (a FIFO)") == std::string::npos)
        throw std::runtime_error(std::string("message: ") + e.what());
      return;
    }
    throw std::runtime_error("a FIFO was replaced");
  });
  EXPECT_EQ(testing::wait_child(pid, std::chrono::seconds(5)), 0);
  EXPECT_TRUE(fs::is_fifo(fifo));
  fs::create_directory(dir_ / "occupied");
  expect_error([&] { t.save((dir_ / "occupied").string()); }, Status::kSystemError,
               "not a regular file (a directory)");
  EXPECT_TRUE(fs::is_directory(dir_ / "occupied"));
  // Nothing was created next to them.
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_NE(entry.path().filename().string().front(), '.') << entry.path();
}

// A save killed between creating its temporary file and renaming it leaves that file behind;
// a later save of the same target removes the ones older than a minute (younger ones may belong
// to a save still in progress, here or on another host sharing the directory).
TEST_F(TuneFile, SaveRemovesStaleTemporaryFilesOfItsTarget) {
  const TuneTable t = numbered_table(4096);
  const fs::path path = dir_ / "tune.txt";
  const fs::path other = dir_ / "other.txt";
  auto crash_saving = [&](const fs::path& target) {
    const pid_t pid = testing::fork_child([&] {
      // The first write() past the limit kills the process with SIGXFSZ, mid-save.
      const rlimit none{0, 0};
      ::setrlimit(RLIMIT_FSIZE, &none);
      t.save(target.string());
    });
    EXPECT_EQ(testing::wait_child(pid, std::chrono::seconds(5)), 128 + SIGXFSZ);
  };
  auto temporaries = [&] {
    std::vector<fs::path> out;
    for (const auto& entry : fs::directory_iterator(dir_))
      if (entry.path().filename().string().front() == '.') out.push_back(entry.path());
    std::sort(out.begin(), out.end());
    return out;
  };
  auto age = [](const fs::path& p) {
    fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::minutes(2));
  };
  auto of_other = [&] {
    int n = 0;
    for (const fs::path& p : temporaries()) n += p.filename().string().starts_with(".other.txt");
    return n;
  };
  crash_saving(path);
  crash_saving(path);
  crash_saving(other);
  ASSERT_EQ(temporaries().size(), 3u);
  for (const fs::path& p : temporaries()) age(p);
  // This save removes the two stale files of its target before it is killed in turn.
  crash_saving(path);
  EXPECT_EQ(temporaries().size(), 2u);  // the other target's and the fresh one
  EXPECT_EQ(of_other(), 1);

  t.save(path.string());  // keeps the fresh one: it could be a save in progress
  EXPECT_EQ(read(path), t.to_text());
  EXPECT_EQ(temporaries().size(), 2u);

  for (const fs::path& p : temporaries()) age(p);
  t.save(path.string());
  ASSERT_EQ(temporaries().size(), 1u);
  EXPECT_EQ(of_other(), 1);
}

// ---------------------------------------------------------------------------------------------
// Paths

std::string path_with(const std::map<std::string, std::string>& env, const TuneKey& key) {
  return default_tune_path(key, [&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

TEST(TunePath, DefaultLocation) {
  const TuneKey k = h200_key();
  EXPECT_EQ(path_with({{"XDG_CACHE_HOME", "/x/cache"}, {"HOME", "/home/u"}}, k),
            "/x/cache/tpcomm/tune-w8-nvidia-h200.txt");
  EXPECT_EQ(path_with({{"HOME", "/home/u"}}, k), "/home/u/.cache/tpcomm/tune-w8-nvidia-h200.txt");
  // Empty or relative values do not count (XDG base directory rules).
  EXPECT_EQ(path_with({{"XDG_CACHE_HOME", ""}, {"HOME", "/home/u"}}, k),
            "/home/u/.cache/tpcomm/tune-w8-nvidia-h200.txt");
  EXPECT_EQ(path_with({{"XDG_CACHE_HOME", "rel/cache"}, {"HOME", "/home/u"}}, k),
            "/home/u/.cache/tpcomm/tune-w8-nvidia-h200.txt");
  EXPECT_EQ(path_with({}, k), "/tmp/tpcomm-cache/tune-w8-nvidia-h200.txt");
  EXPECT_EQ(path_with({{"HOME", ""}}, k), "/tmp/tpcomm-cache/tune-w8-nvidia-h200.txt");
}

TEST(TunePath, GpuSlug) {
  auto file_for = [](std::string gpu, int world) {
    TuneKey k = h200_key();
    k.gpu = std::move(gpu);
    k.world_size = world;
    return fs::path(path_with({}, k)).filename().string();
  };
  EXPECT_EQ(file_for("NVIDIA H100 80GB HBM3", 4), "tune-w4-nvidia-h100-80gb-hbm3.txt");
  EXPECT_EQ(file_for("  --NVIDIA__B200--  ", 2), "tune-w2-nvidia-b200.txt");
  EXPECT_EQ(file_for("../../etc/passwd", 8), "tune-w8-etc-passwd.txt");
  EXPECT_EQ(file_for("", 8), "tune-w8-unknown.txt");
  EXPECT_EQ(file_for("ümlaut GPU", 8), "tune-w8-mlaut-gpu.txt");
}

TEST(TunePath, TuneFileOptionOverridesTheDefault) {
  Options o;
  EXPECT_EQ(tune_path(o, h200_key()), default_tune_path(h200_key()));
  o.tune_file = "/shared/tables/h200.txt";
  EXPECT_EQ(tune_path(o, h200_key()), "/shared/tables/h200.txt");
}

}  // namespace
}  // namespace tpcomm
