// The model hash cache never returns a stale hash: any write to the file
// changes its identity (ctime), and a rewrite of the same size is rehashed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "touchstone/harness/model_store.h"

namespace touchstone {
namespace {

TEST(ModelStore, CachedHashFollowsEveryWrite) {
  const auto dir = std::filesystem::temp_directory_path() / "touchstone_model_store_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "m.gguf").string();
  std::ofstream(path) << "first";
  const std::string a = sha256_file_cached(path);
  EXPECT_EQ(a, sha256_file(path));
  EXPECT_TRUE(std::filesystem::exists(path + ".sha256-cache"));
  EXPECT_EQ(sha256_file_cached(path), a);  // from the cache
  std::ofstream(path) << "other";          // same size, new bytes
  EXPECT_NE(sha256_file_cached(path), a);
  EXPECT_EQ(sha256_file_cached(path), sha256_file(path));
  std::ofstream(path + ".sha256-cache") << "garbage";
  EXPECT_EQ(sha256_file_cached(path), sha256_file(path));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace touchstone
