// backend_file_test.cpp - backend.json read and checked (every in-tree file,
// and the errors of malformed ones), and the matrix rows the files declare.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "touchstone/common/error.h"
#include "touchstone/run/backend_file.h"

namespace {

namespace fs = std::filesystem;
using touchstone::BackendFile;
using touchstone::MatrixRow;

const fs::path kRoot = fs::path(TOUCHSTONE_RUN_MANIFEST).parent_path().parent_path();

TEST(BackendFile, EveryInTreeFileReadsAndNamesItsFolder) {
  const auto files = touchstone::find_backend_files(kRoot.string());
  ASSERT_GE(files.size(), 6u);  // reference, cpu_simd, vulkan, static_graph, cuda, llamacpp
  for (const BackendFile& b : files) {
    const std::string folder = fs::path(b.path).parent_path().filename().string();
    EXPECT_EQ(folder == "backend" ? "reference" : folder, b.name) << b.path;
    EXPECT_FALSE(b.parity.empty()) << b.path;
    for (const auto& e : b.parity) {
      if (!e.known_divergences.empty()) {
        EXPECT_TRUE(fs::exists(e.known_divergences)) << b.path;
      }
    }
  }
}

void expect_error(const std::string& text, const std::string& needle) {
  const fs::path p = fs::temp_directory_path() / "ts_backend_file_test.json";
  std::ofstream(p) << text;
  try {
    touchstone::read_backend_file(p.string());
    ADD_FAILURE() << "read: " << text;
  } catch (const touchstone::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
  fs::remove(p);
}

// A file with `parity` and `matrix` as given.
std::string file_with(const std::string& parity, const std::string& matrix) {
  return R"({"touchstone_backend": 1, "name": "x", "parity": )" + parity + R"(, "matrix": )" +
         matrix + "}";
}

TEST(BackendFile, MalformedFilesNameTheField) {
  const std::string q = R"([{"weights": "quantized", "tier": "quantized"}])";
  const std::string paths = R"({"paths": [{"weights": "quantized"}]})";
  expect_error("{", "not JSON");
  expect_error(R"({"touchstone_backend": 2})", "/touchstone_backend: expected 1");
  expect_error(file_with(R"([{"weights": "quantized", "tear": "quantized"}])", paths),
               "/parity/0/tear: unknown member");
  expect_error(file_with(R"([{"weights": "int4", "tier": "quantized"}])", paths),
               "/parity/0/weights: 'int4'");
  expect_error(file_with(q, R"({"paths": [{"weights": "full_precision"}]})"),
               "/matrix/paths: weights 'full_precision' has no /parity entry");
  expect_error(file_with(q, R"({"start": "first", "paths": []})"),
               "/matrix/start: expected an integer");
  expect_error(R"({"touchstone_backend": 1, "name": "x", "parity": []})", "/matrix: missing");
  expect_error(R"({"touchstone_backend": 1, "name": "x", "parity": [], "serving":
                  [{"weights": "quantized"}], "matrix": {"paths": []}})",
               "/serving/0/weights: 'quantized' has no /parity entry");
  expect_error(R"({"touchstone_backend": 1, "name": "x", "parity": [], "serving":
                  [{"weights": "quantized", "plan": "huge"}], "matrix": {"paths": []}})",
               "/serving/0/plan: 'huge'");
}

BackendFile backend(const std::string& name, int start, bool two_paths) {
  BackendFile b;
  b.name = name;
  b.start = start;
  b.parity.push_back({"quantized", "quantized", "", "", "", {}, {}, ""});
  b.paths.push_back({"quantized", {}});
  if (two_paths) {
    b.parity.push_back({"full_precision", "exact", "", "", "", {}, {}, ""});
    b.paths.insert(b.paths.begin(), {"full_precision", {}});
  }
  return b;
}

bool has(const MatrixRow& r, const std::string& flag) {
  return std::ranges::count(r.args, flag) > 0;
}

TEST(BackendFile, QuickMatrixPlacesTheGoldenFreeChecksOncePerBackend) {
  BackendFile ref = backend("reference", 9, false);
  ref.quick_suite = "smoke";
  ref.quick_max_steps = 16;
  ref.golden_free = false;
  const auto rows =
      touchstone::matrix_rows({ref, backend("b", 1, true)}, {"m1", "m2"}, {"window"}, "quick");
  ASSERT_EQ(rows.size(), 6u);  // per model: b fp, b q, reference q
  // b on the first model: golden-free checks on its quantized path only.
  EXPECT_EQ(rows[0].weights, "full_precision");
  EXPECT_TRUE(has(rows[0], "--no-serving") && has(rows[0], "--skip-case"));
  EXPECT_TRUE(has(rows[1], "--structured") && !has(rows[1], "--no-serving"));
  EXPECT_EQ(rows[2].backend, "reference");  // start order within a model
  EXPECT_EQ(rows[2].suite, "smoke");
  EXPECT_TRUE(has(rows[2], "--max-steps") && has(rows[2], "--no-consistency"));
  // The second model: goldens only.
  EXPECT_TRUE(has(rows[4], "--no-serving") && !has(rows[4], "--structured"));
  // The full suite adds no policy flags.
  for (const MatrixRow& r : touchstone::matrix_rows({backend("b", 1, true)}, {"m1"}, {}, "full"))
    EXPECT_TRUE(r.args.empty());
}

}  // namespace
