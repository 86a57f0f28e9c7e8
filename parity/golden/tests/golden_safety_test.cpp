// Goldens that cannot be swapped or broken: the header and the
// manifest pin refuse damaged, truncated and swapped files before libhdf5 sees
// them; a failed or killed write leaves the previous golden byte-identical.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "golden_fixture.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/golden.h"
#include "touchstone/golden/manifest.h"

using namespace golden_testing;  // NOLINT(google-build-using-namespace): test helpers

namespace {

// A manifest in `dir` whose one model has golden "model.h5", pinned to
// `golden_sha256` (no pin when empty).
std::string write_manifest(const fs::path& dir, const std::string& golden_sha256) {
  const std::string pin =
      golden_sha256.empty() ? "" : ",\n      \"golden_sha256\": \"" + golden_sha256 + "\"";
  const std::string p = (dir / "manifest.json").string();
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      << "{\n  \"format_version\": 1,\n  \"models\": [\n    {\n      \"name\": \"m\",\n"
         "      \"package\": \"p\",\n      \"package_version\": \"1\",\n"
         "      \"file_in_package\": \"m.gguf\",\n      \"filename\": \"m.gguf\",\n"
         "      \"sha256\": \"" +
             std::string(64, 'a') + "\",\n      \"golden\": \"model.h5\"" + pin +
             "\n    }\n  ],\n  \"profiles\": {},\n  \"cases\": []\n}\n";
  return p;
}

void expect_error_with(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    // Refused before libhdf5: no HDF5 error stack in the message.
    EXPECT_EQ(msg.find("(HDF5:"), std::string::npos) << msg;
  }
}

}  // namespace

TEST_F(GoldenTest, FlippedMagicByteIsRefusedBeforeHdf5) {
  const std::string good = path("good.h5");
  touchstone::write_golden_file(good, make_golden());
  const std::string bytes = slurp(good);
  for (size_t at : {size_t{0}, size_t{9}, size_t{17}}) {  // 'T', 'G', '\n' of the magic
    std::string b = bytes;
    b[at] = static_cast<char>(b[at] ^ 0x01);
    const std::string p = path("magic" + std::to_string(at) + ".h5");
    spit(p, b);
    expect_error_with([&] { touchstone::read_golden_file(p); },
                      {p, "not a valid golden file", "touchstone golden", "--trust-goldens"});
  }
  // Damaged header fields (size, hash) are refused too.
  std::string b = bytes;
  b[b.find("bytes ") + 6] = '9';
  spit(path("size.h5"), b);
  expect_error_with([&] { touchstone::read_golden_file(path("size.h5")); },
                    {"corrupted or truncated golden file"});
}

TEST_F(GoldenTest, TruncatedGoldenIsRefusedBeforeHdf5) {
  const std::string good = path("good.h5");
  touchstone::write_golden_file(good, make_golden());
  const std::string bytes = slurp(good);
  for (size_t len : {size_t{0}, size_t{17}, size_t{511}, size_t{512}, bytes.size() - 1}) {
    const std::string p = path("t" + std::to_string(len) + ".h5");
    spit(p, bytes.substr(0, len));
    expect_error_with([&] { touchstone::read_golden_file(p); }, {p, "truncated"});
  }
}

TEST_F(GoldenTest, SwappedGoldenIsRefusedByThePin) {
  const std::string p = path("model.h5");
  touchstone::write_golden_file(p, make_golden(1));
  const std::string pinned = touchstone::sha256_hex(slurp(p));
  const touchstone::Manifest m = touchstone::load_manifest(write_manifest(dir_, pinned));
  const touchstone::ManifestModel& mm = m.find_model("m");
  EXPECT_TRUE(touchstone::diff_golden(make_golden(1), touchstone::read_pinned_golden(m, mm, false))
                  .empty());

  // A valid, well-stamped golden with other content, copied over the pinned one.
  touchstone::write_golden_file(p, make_golden(2));
  const std::string actual = touchstone::sha256_hex(slurp(p));
  ASSERT_NE(actual, pinned);
  expect_error_with([&] { touchstone::read_pinned_golden(m, mm, false); },
                    {p, pinned, actual, "touchstone golden", "--trust-goldens"});
  // --trust-goldens reads it anyway.
  EXPECT_TRUE(
      touchstone::diff_golden(make_golden(2), touchstone::read_pinned_golden(m, mm, true)).empty());

  // No pin: refused, naming the hash to pin.
  const touchstone::Manifest unpinned = touchstone::load_manifest(write_manifest(dir_, ""));
  expect_error_with(
      [&] { touchstone::read_pinned_golden(unpinned, unpinned.find_model("m"), false); },
      {"golden_sha256", actual, "--trust-goldens"});
}

TEST_F(GoldenTest, PinGoldenSha256EditsOnlyThePin) {
  const std::string sha1(64, '1'), sha2(64, '2');
  const std::string p = write_manifest(dir_, "");
  touchstone::pin_golden_sha256(p, "m", sha1);
  EXPECT_EQ(slurp(p), slurp(write_manifest(dir_, sha1)));  // same bytes as written by hand
  touchstone::pin_golden_sha256(p, "m", sha2);
  EXPECT_EQ(slurp(p), slurp(write_manifest(dir_, sha2)));
  EXPECT_EQ(touchstone::load_manifest(p).find_model("m").golden_sha256, sha2);
  EXPECT_THROW(touchstone::pin_golden_sha256(p, "nope", sha1), Error);
  EXPECT_TRUE(leftovers().empty());
}

TEST_F(GoldenTest, StaleTempFilesOfDeadWritersAreRemoved) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // a pid that is no longer running
  const std::string dead = std::to_string(child), live = std::to_string(::getppid());
  for (const std::string& n : {".model.h5.tmp-" + dead, "model.h5.tmp." + dead,
                               ".model.h5.tmp-" + live, ".other.h5.tmp-" + dead})
    spit(path(n), "partial");
  const std::vector<std::string> removed = touchstone::remove_stale_golden_temps(path("model.h5"));
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_FALSE(fs::exists(path(".model.h5.tmp-" + dead)));
  EXPECT_FALSE(fs::exists(path("model.h5.tmp." + dead)));
  EXPECT_TRUE(fs::exists(path(".model.h5.tmp-" + live)));  // a running writer's
  EXPECT_TRUE(fs::exists(path(".other.h5.tmp-" + dead)));  // another file's
}

// A file-size limit makes the write fail part way (EFBIG) as a full disk
// would; the old golden must stay byte-identical and no temp file remain.
TEST_F(GoldenTest, WriteErrorKeepsPreviousGoldenByteIdentical) {
  const std::string p = path("model.h5");
  touchstone::write_golden_file(p, make_golden(1));
  const std::string before = slurp(p);
  GoldenFile big = make_golden(2);
  big.cases[0].full_logits.assign(big.cases[0].full_logits.size(), 0.0f);
  for (size_t i = 0; i < big.cases[0].full_logits.size(); ++i)
    big.cases[0].full_logits[i] = static_cast<float>(i) * 1.37f;  // incompressible enough

  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 1024;
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    touchstone::write_golden_file(p, big);
  } catch (const Error& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find(std::strerror(EFBIG)), std::string::npos) << msg;
  EXPECT_NE(msg.find(".model.h5.tmp-"), std::string::npos) << msg;
  EXPECT_EQ(slurp(p), before);
  EXPECT_TRUE(leftovers().empty());
}

// The real thing: a full tmpfs (needs root and mount; SKIPs otherwise).
TEST_F(GoldenTest, FullDiskKeepsPreviousGoldenByteIdentical) {
  const fs::path mnt = dir_ / "tmpfs";
  fs::create_directories(mnt);
  const std::string cmd = "mount -t tmpfs -o size=2m tmpfs '" + mnt.string() + "' 2>/dev/null";
  if (::geteuid() != 0 || std::system(cmd.c_str()) != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs (needs root and mount): full-disk path not run";
  struct Unmount {
    std::string dir;
    ~Unmount() { std::system(("umount '" + dir + "'").c_str()); }
  } unmount{mnt.string()};
  const std::string p = (mnt / "model.h5").string();
  touchstone::write_golden_file(p, make_golden(1));
  const std::string before = slurp(p);
  // Fill the rest of the disk.
  {
    std::ofstream fill(mnt / "fill", std::ios::binary);
    const std::string block(4096, 'x');
    while (fill.write(block.data(), static_cast<std::streamsize>(block.size()))) {
    }
  }
  std::string msg;
  try {
    touchstone::write_golden_file(p, make_golden(2));
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(std::strerror(ENOSPC)), std::string::npos) << msg;
  EXPECT_EQ(slurp(p), before);
  for (const auto& e : fs::directory_iterator(mnt))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// kill -9 while `touchstone golden` writes: a child process rewrites the golden
// in a loop and is killed while it writes. The golden must be the old bytes or
// the complete new ones, never a partial file, and the next run removes the
// dead writer's temp file.
TEST_F(GoldenTest, KilledWriterLeavesPreviousGoldenIntact) {
  const std::string p = path("model.h5");
  touchstone::write_golden_file(p, make_golden(1));
  const std::string before = slurp(p);
  GoldenFile next = make_golden(2);
  next.cases.push_back(make_case_for_size(3, 4 << 20));  // a few MB: a write takes a while
  touchstone::write_golden_file(path("expected.h5"), next);
  const std::string after = slurp(path("expected.h5"));
  fs::remove(path("expected.h5"));

  int mid_write = 0;
  for (int round = 0; round < 12; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // never returns into gtest
      try {
        for (;;) touchstone::write_golden_file(p, next);
      } catch (...) {
      }
      ::_exit(1);
    }
    const std::string tmp = path(".model.h5.tmp-" + std::to_string(child));
    // Kill when the write starts (the temp file appears, or the golden changes
    // size: a writer that writes in place), at once or a little later.
    std::error_code ec;
    for (int spin = 0; spin < 2000000; ++spin)
      if (fs::exists(tmp) || fs::file_size(p, ec) != before.size()) break;
    ::usleep(static_cast<useconds_t>((round % 4) * 300));
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    const bool killed_mid_write = fs::exists(tmp);
    mid_write += killed_mid_write ? 1 : 0;
    const std::string now = slurp(p);
    EXPECT_TRUE(now == before || now == after) << "partial golden after kill -9, round " << round;
    EXPECT_EQ(touchstone::remove_stale_golden_temps(p).size(), killed_mid_write ? 1u : 0u);
    EXPECT_TRUE(leftovers().empty()) << "temp file of the killed writer not removed";
    EXPECT_NO_THROW(touchstone::read_golden_file(p));
    spit(p, before);
  }
  if (mid_write == 0) GTEST_SKIP() << "never killed the writer mid-write (machine too fast?)";
}

// The committed golden: matches its manifest pin, and the writer reproduces
// it byte for byte (so a change to the writer cannot silently change the format).
TEST_F(GoldenTest, CommittedGoldenIsPinnedAndRewrittenByteIdentical) {
  const touchstone::Manifest m = touchstone::load_manifest(TOUCHSTONE_GOLDENS_DIR "/manifest.json");
  ASSERT_FALSE(m.models.empty());
  for (const touchstone::ManifestModel& mm : m.models) {
    ASSERT_FALSE(mm.golden_sha256.empty()) << mm.name << ": committed golden not pinned";
    const GoldenFile g = touchstone::read_pinned_golden(m, mm, /*trust=*/false);
    const std::string p = path(mm.name + ".h5");
    touchstone::write_golden_file(p, g);
    EXPECT_EQ(touchstone::sha256_hex(slurp(p)), mm.golden_sha256) << mm.name;
  }
}

// Fuzz-found inputs (fuzz/regressions, also run by ci/fuzz) in the ordinary
// unit tests: each damaged golden is refused before libhdf5 opens it (no
// HDF5 error in the message), each bad manifest is an Error naming the file.
TEST_F(GoldenTest, FuzzRegressionInputsAreRefused) {
  const fs::path root = TOUCHSTONE_FUZZ_REGRESSIONS_DIR;
  int goldens = 0, manifests = 0;
  for (const auto& e : fs::directory_iterator(root / "golden_fuzz")) {
    const std::string p = e.path().string();
    expect_error_with([&] { touchstone::read_golden_file(p); }, {p, "--trust-goldens"});
    ++goldens;
  }
  for (const auto& e : fs::directory_iterator(root / "manifest_fuzz")) {
    const std::string p = e.path().string();
    expect_error_with([&] { touchstone::load_manifest(p); }, {p + ": "});
    ++manifests;
  }
  EXPECT_GT(goldens, 0);
  EXPECT_GT(manifests, 0);
}
