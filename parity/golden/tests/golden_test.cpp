// Tests for golden-file I/O: round trip, diff, atomic write, malformed files.
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
#include <limits>
#include <random>
#include <string>

#include "touchstone/error.h"
#include "touchstone/golden.h"

namespace fs = std::filesystem;
using touchstone::Error;
using touchstone::GoldenCase;
using touchstone::GoldenFile;
using touchstone::GoldenScoring;

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
// memcmp of two equal-size vectors (no null pointers for empty ones).
template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

GoldenCase make_case(std::mt19937& rng, const std::string& name, int32_t vocab, int32_t k, size_t p,
                     size_t g, int32_t f) {
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  GoldenCase c;
  c.name = name;
  c.n_vocab = vocab;
  c.top_k = k;
  c.n_full_steps = f;
  for (size_t i = 0; i < p; ++i) c.prompt_ids.push_back(id(rng));
  for (size_t i = 0; i < g; ++i) c.greedy_ids.push_back(id(rng));
  for (size_t i = 0; i < static_cast<size_t>(f) * static_cast<size_t>(vocab); ++i)
    c.full_logits.push_back(logit(rng));
  for (size_t i = 0; i < g * static_cast<size_t>(k); ++i) {
    c.topk_ids.push_back(id(rng));
    c.topk_logits.push_back(logit(rng));
  }
  for (size_t i = 0; i < g; ++i) c.lse.push_back(static_cast<double>(logit(rng)) * 1.000001);
  return c;
}

GoldenFile make_golden(unsigned seed = 42) {
  std::mt19937 rng(seed);
  GoldenFile g;
  g.model_name = "smollm2-135m-instruct-q4_1";
  g.model_sha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
  g.reference_version = "0.1.0";
  g.reference_revision = "abc123-dirty";

  // Deliberately not in alphabetical order: order must survive a round trip.
  GoldenCase zeta = make_case(rng, "zeta", 50, 5, 6, 8, 3);
  zeta.prompt_text = "Once upon a time";
  zeta.greedy_text = std::string("ok \xff\xfe\x00 \xc3(", 9);  // invalid UTF-8 + NUL
  // Special bit patterns.
  zeta.full_logits[0] = std::numeric_limits<float>::quiet_NaN();
  zeta.full_logits[1] = from_bits(0x7fc01234u);  // NaN with payload
  zeta.full_logits[2] = from_bits(0xffc00001u);  // negative NaN
  zeta.full_logits[3] = std::numeric_limits<float>::infinity();
  zeta.full_logits[4] = -std::numeric_limits<float>::infinity();
  zeta.full_logits[5] = -0.0f;
  zeta.full_logits[6] = std::numeric_limits<float>::denorm_min();
  zeta.topk_logits[0] = -0.0f;
  zeta.lse[0] = std::numeric_limits<double>::quiet_NaN();
  zeta.lse[1] = -0.0;
  g.cases.push_back(zeta);

  GoldenCase alpha = make_case(rng, "alpha", 50, 5, 3, 4, 4);
  alpha.chat = true;
  alpha.prompt_text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  alpha.greedy_text = "Hello!";
  g.cases.push_back(alpha);

  // Everything empty: empty prompt, no greedy tokens, F = 0.
  GoldenCase empty = make_case(rng, "empty-prompt", 7, 0, 0, 0, 0);
  g.cases.push_back(empty);

  // Larger case so full_logits spans several compressed chunks.
  g.cases.push_back(make_case(rng, "big.case", 20000, 10, 5, 6, 6));

  GoldenScoring s;
  s.name = "passage";
  s.text = "The quick brown fox jumps over the lazy dog.";
  s.n_vocab = 50;
  s.top_k = 4;
  std::uniform_int_distribution<int32_t> id(0, 49);
  for (int i = 0; i < 10; ++i) s.token_ids.push_back(id(rng));
  for (int i = 0; i < 9 * 4; ++i) {
    s.topk_ids.push_back(id(rng));
    s.topk_logits.push_back(static_cast<float>(i) * 0.25f - 3.0f);
  }
  for (int i = 0; i < 9; ++i) {
    s.lse.push_back(1.0 / (i + 1));
    s.target_logits.push_back(static_cast<float>(-i));
  }
  g.scoring.push_back(s);

  GoldenScoring single;
  single.name = "one-token";
  single.text = "x";
  single.n_vocab = 50;
  single.top_k = 4;
  single.token_ids = {3};
  g.scoring.push_back(single);
  return g;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void spit(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Zeroes the checksum header (user block): a file as another tool writes it.
void strip_checksum(const std::string& p) {
  std::string b = slurp(p);
  b.replace(0, 512, std::string(512, '\0'));
  spit(p, b);
}

// Re-stamps a valid header so that a file edited with the HDF5 API reaches
// the structural checks instead of failing the checksum.
void restamp(const std::string& p) { spit(p, touchstone::stamp_golden_header(slurp(p))); }

class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("touchstone_golden_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a valid golden file, then lets `edit` break it with the HDF5 API.
  std::string broken(const std::string& name, const std::function<void(hid_t)>& edit) {
    const std::string p = path(name);
    touchstone::write_golden_file(p, make_golden());
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    EXPECT_GE(f, 0);
    edit(f);
    EXPECT_GE(H5Fclose(f), 0);
    restamp(p);
    return p;
  }

  // Expects read_golden_file to throw an Error mentioning the file and all `parts`.
  void expect_read_error(const std::string& p, const std::vector<std::string>& parts) {
    try {
      touchstone::read_golden_file(p);
      ADD_FAILURE() << "no error reading " << p;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  }

  std::vector<std::string> leftovers() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().find(".tmp") != std::string::npos)
        out.push_back(e.path().string());
    return out;
  }

  fs::path dir_;
};

void write_i32(hid_t loc, const char* name, std::vector<hsize_t> dims, int32_t value = 0) {
  hsize_t total = 1;
  for (auto d : dims) total *= d;
  std::vector<int32_t> data(total, value);
  hid_t sp = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(loc, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  if (total) H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
  H5Dclose(d);
  H5Sclose(sp);
}

void set_attr_i32(hid_t loc, const char* obj, const char* name, int32_t v) {
  // (H5Aopen_by_name + H5Awrite fails in HDF5 1.10: open the object first.)
  hid_t o = H5Oopen(loc, obj, H5P_DEFAULT);
  ASSERT_GE(o, 0);
  hid_t a = H5Aopen(o, name, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT32, &v), 0);
  H5Aclose(a);
  H5Oclose(o);
}

}  // namespace

TEST_F(GoldenTest, RoundTripIsBitExactAndKeepsOrder) {
  const GoldenFile g = make_golden();
  const std::string p = path("model.h5");
  touchstone::write_golden_file(p, g);
  const GoldenFile r = touchstone::read_golden_file(p);

  EXPECT_TRUE(touchstone::diff_golden(g, r).empty());
  EXPECT_EQ(r.format_version, touchstone::kGoldenFormatVersion);
  EXPECT_EQ(r.model_name, g.model_name);
  EXPECT_EQ(r.model_sha256, g.model_sha256);
  EXPECT_EQ(r.reference_version, g.reference_version);
  EXPECT_EQ(r.reference_revision, g.reference_revision);
  ASSERT_EQ(r.cases.size(), g.cases.size());
  for (size_t i = 0; i < g.cases.size(); ++i) {
    const auto &a = g.cases[i], &b = r.cases[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.prompt_text, b.prompt_text);
    EXPECT_EQ(a.chat, b.chat);
    EXPECT_EQ(a.prompt_ids, b.prompt_ids);
    EXPECT_EQ(a.greedy_ids, b.greedy_ids);
    EXPECT_EQ(a.greedy_text, b.greedy_text);
    EXPECT_EQ(a.n_vocab, b.n_vocab);
    EXPECT_EQ(a.top_k, b.top_k);
    EXPECT_EQ(a.n_full_steps, b.n_full_steps);
    EXPECT_EQ(a.topk_ids, b.topk_ids);
    EXPECT_TRUE(same_bytes(a.full_logits, b.full_logits));
    EXPECT_TRUE(same_bytes(a.topk_logits, b.topk_logits));
    EXPECT_TRUE(same_bytes(a.lse, b.lse));
  }
  EXPECT_EQ(r.cases[0].name, "zeta");
  EXPECT_EQ(r.cases[1].name, "alpha");
  EXPECT_EQ(to_bits(r.cases[0].full_logits[1]), 0x7fc01234u);
  EXPECT_EQ(to_bits(r.cases[0].full_logits[5]), 0x80000000u);
  EXPECT_EQ(r.cases[0].greedy_text.size(), 9u);
  EXPECT_TRUE(r.cases[2].prompt_text.empty());
  ASSERT_EQ(r.scoring.size(), 2u);
  EXPECT_EQ(r.scoring[0].name, "passage");
  EXPECT_EQ(r.scoring[0].target_logits, g.scoring[0].target_logits);
  EXPECT_EQ(r.scoring[1].token_ids, std::vector<int32_t>{3});
  ASSERT_NE(r.find_case("alpha"), nullptr);
  EXPECT_TRUE(r.find_case("alpha")->chat);
  EXPECT_EQ(r.find_case("nope"), nullptr);
  ASSERT_NE(r.find_scoring("passage"), nullptr);
  EXPECT_TRUE(leftovers().empty());
}

TEST_F(GoldenTest, SameContentGivesSameBytes) {
  touchstone::write_golden_file(path("a.h5"), make_golden());
  touchstone::write_golden_file(path("b.h5"), make_golden());
  std::ifstream a(path("a.h5"), std::ios::binary), b(path("b.h5"), std::ios::binary);
  const std::string sa((std::istreambuf_iterator<char>(a)), {});
  const std::string sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(sa, sb);
}

TEST_F(GoldenTest, FullLogitsAreCompressed) {
  GoldenFile g = make_golden();
  for (auto& c : g.cases)
    for (auto& v : c.full_logits) v = 1.0f;  // compressible
  touchstone::write_golden_file(path("c.h5"), g);
  size_t raw = 0;
  for (const auto& c : g.cases) raw += c.full_logits.size() * sizeof(float);
  EXPECT_LT(fs::file_size(path("c.h5")), raw / 4);
}

TEST_F(GoldenTest, EmptyFileRoundTrips) {
  GoldenFile g;
  touchstone::write_golden_file(path("e.h5"), g);
  const GoldenFile r = touchstone::read_golden_file(path("e.h5"));
  EXPECT_TRUE(r.cases.empty());
  EXPECT_TRUE(r.scoring.empty());
  EXPECT_TRUE(touchstone::diff_golden(g, r).empty());
}

TEST_F(GoldenTest, DiffFindsSingleFlippedBit) {
  const GoldenFile a = make_golden();
  GoldenFile b = a;
  // alpha: K = 5, flat index 7 = [1, 2].
  b.cases[1].topk_logits[7] = from_bits(to_bits(b.cases[1].topk_logits[7]) ^ 1u);
  auto d = touchstone::diff_golden(a, b);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("case 'alpha'"), std::string::npos) << d[0];
  EXPECT_NE(d[0].find("topk_logits[1, 2]"), std::string::npos) << d[0];
  EXPECT_NE(d[0].find("1 of 20"), std::string::npos) << d[0];

  // -0.0 vs +0.0 compare equal as floats but differ in bits.
  b = a;
  b.cases[0].full_logits[5] = 0.0f;
  d = touchstone::diff_golden(a, b);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("case 'zeta': full_logits[0, 5]"), std::string::npos) << d[0];

  // NaN payload change.
  b = a;
  b.cases[0].full_logits[1] = from_bits(0x7fc01235u);
  EXPECT_EQ(touchstone::diff_golden(a, b).size(), 1u);

  b = a;
  b.scoring[0].lse[4] = std::nextafter(b.scoring[0].lse[4], 2.0);
  d = touchstone::diff_golden(a, b);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("scoring 'passage': lse[4]"), std::string::npos) << d[0];

  b = a;
  b.cases[0].greedy_text[4] = 'x';
  d = touchstone::diff_golden(a, b);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("greedy_text: byte 4"), std::string::npos) << d[0];

  b = a;
  b.cases[1].chat = false;
  b.reference_revision = "other";
  EXPECT_EQ(touchstone::diff_golden(a, b).size(), 2u);
}

TEST_F(GoldenTest, DiffReportsStructuralChanges) {
  const GoldenFile a = make_golden();
  GoldenFile b = a;
  std::swap(b.cases[0], b.cases[1]);
  auto d = touchstone::diff_golden(a, b);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("order differs"), std::string::npos) << d[0];

  b = a;
  b.cases.erase(b.cases.begin());
  b.scoring.push_back(b.scoring[0]);
  b.scoring.back().name = "extra";
  d = touchstone::diff_golden(a, b);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NE(d[0].find("case 'zeta': missing in fresh"), std::string::npos) << d[0];
  EXPECT_NE(d[1].find("scoring 'extra': not in committed"), std::string::npos) << d[1];

  b = a;
  b.cases[0].greedy_ids.push_back(1);
  d = touchstone::diff_golden(a, b);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("greedy_ids: size differs: committed 8, fresh 9"), std::string::npos) << d[0];
}

TEST_F(GoldenTest, WriteRejectsInvalidAndKeepsOldFile) {
  const std::string p = path("model.h5");
  const GoldenFile good = make_golden();
  touchstone::write_golden_file(p, good);

  GoldenFile bad = good;
  bad.cases[1].topk_ids.pop_back();
  try {
    touchstone::write_golden_file(p, bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/cases/alpha/topk_ids"), std::string::npos) << e.what();
  }
  bad = good;
  bad.cases[0].greedy_ids[2] = 50;  // == n_vocab
  EXPECT_THROW(touchstone::write_golden_file(p, bad), Error);
  bad = good;
  bad.cases[0].n_full_steps = 9;  // > G
  EXPECT_THROW(touchstone::write_golden_file(p, bad), Error);
  bad = good;
  bad.cases[1].name = "zeta";  // duplicate
  EXPECT_THROW(touchstone::write_golden_file(p, bad), Error);
  bad = good;
  bad.cases[1].name = "a/b";
  EXPECT_THROW(touchstone::write_golden_file(p, bad), Error);
  bad = good;
  bad.scoring[0].target_logits.push_back(0.0f);
  EXPECT_THROW(touchstone::write_golden_file(p, bad), Error);

  EXPECT_TRUE(touchstone::diff_golden(good, touchstone::read_golden_file(p)).empty());
  EXPECT_TRUE(leftovers().empty());
}

TEST_F(GoldenTest, WriteFailureBeforeRenameKeepsOldFile) {
  const std::string p = path("model.h5");
  const GoldenFile good = make_golden();
  touchstone::write_golden_file(p, good);
  // The temp file cannot be created: its name is taken by a directory.
  const std::string tmp = path(".model.h5.tmp-" + std::to_string(::getpid()));
  fs::create_directory(tmp);
  GoldenFile other = good;
  other.model_name = "other";
  EXPECT_THROW(touchstone::write_golden_file(p, other), Error);
  fs::remove(tmp);
  EXPECT_TRUE(touchstone::diff_golden(good, touchstone::read_golden_file(p)).empty());

  // The final rename fails (target is a non-empty directory): temp is removed.
  const std::string d = path("dir.h5");
  fs::create_directories(fs::path(d) / "x");
  EXPECT_THROW(touchstone::write_golden_file(d, good), Error);
  EXPECT_TRUE(fs::is_directory(d));
  EXPECT_TRUE(leftovers().empty());

  // Missing directory.
  EXPECT_THROW(touchstone::write_golden_file(path("no/such/dir.h5"), good), Error);
}

TEST_F(GoldenTest, ReadRejectsMissingGarbageAndTruncatedFiles) {
  expect_read_error(path("missing.h5"), {"cannot open"});

  { std::ofstream(path("empty.h5"), std::ios::binary); }
  expect_read_error(path("empty.h5"), {});
  {
    std::ofstream o(path("garbage.h5"), std::ios::binary);
    std::mt19937 rng(1);
    for (int i = 0; i < 4096; ++i) o.put(static_cast<char>(rng()));
  }
  expect_read_error(path("garbage.h5"), {"not a valid golden file", "--trust-goldens"});

  const std::string good = path("good.h5");
  touchstone::write_golden_file(good, make_golden());
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  for (size_t len : {size_t{8}, size_t{100}, size_t{1000}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string t = path("trunc" + std::to_string(len) + ".h5");
    std::ofstream(t, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(len));
    expect_read_error(t, {});
  }
}

TEST_F(GoldenTest, ReadNeverCrashesOnCorruptedBytes) {
  const std::string good = path("good.h5");
  touchstone::write_golden_file(good, make_golden());
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::mt19937 rng(7);
  int errors = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string b = bytes;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    const std::string t = path("corrupt.h5");
    std::ofstream(t, std::ios::binary | std::ios::trunc)
        .write(b.data(), static_cast<std::streamsize>(b.size()));
    try {
      touchstone::read_golden_file(t);  // may succeed (corrupted raw data)
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_EQ(errors, 300);
}

TEST_F(GoldenTest, ChecksumDetectsCorruptionAndHeaderlessNeedsTrust) {
  const std::string p = path("good.h5");
  touchstone::write_golden_file(p, make_golden());
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), {});
  }
  ASSERT_EQ(bytes.rfind("TOUCHSTONE-GOLDEN\n", 0), 0u);
  std::string b = bytes;
  b[b.size() - 100] = static_cast<char>(b[b.size() - 100] ^ 0x10);
  std::ofstream(path("flip.h5"), std::ios::binary)
      .write(b.data(), static_cast<std::streamsize>(b.size()));
  expect_read_error(path("flip.h5"), {"corrupted or truncated"});
  // A header that is present but wrong is refused even with trust.
  EXPECT_THROW(touchstone::read_golden_file(path("flip.h5"), /*trust=*/true), Error);
  // Without the header (e.g. rewritten by other tools) the file is refused,
  // and readable only with trust (--trust-goldens).
  strip_checksum(p);
  expect_read_error(p, {"not a valid golden file", "--trust-goldens"});
  EXPECT_TRUE(
      touchstone::diff_golden(make_golden(), touchstone::read_golden_file(p, /*trust=*/true))
          .empty());
}

TEST_F(GoldenTest, ReadRejectsWrongShape) {
  const std::string p = broken("shape.h5", [](hid_t f) {
    H5Ldelete(f, "/cases/zeta/topk_ids", H5P_DEFAULT);
    hid_t g = H5Gopen2(f, "/cases/zeta", H5P_DEFAULT);
    write_i32(g, "topk_ids", {8, 4});
    H5Gclose(g);
  });
  expect_read_error(p, {"/cases/zeta/topk_ids", "expected shape [8, 5], got [8, 4]"});

  const std::string p2 = broken("rank.h5", [](hid_t f) {
    H5Ldelete(f, "/scoring/passage/lse", H5P_DEFAULT);
    hid_t g = H5Gopen2(f, "/scoring/passage", H5P_DEFAULT);
    hid_t sp = H5Screate(H5S_SCALAR);
    double v = 0;
    hid_t d = H5Dcreate2(g, "lse", H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v);
    H5Dclose(d);
    H5Sclose(sp);
    H5Gclose(g);
  });
  expect_read_error(p2, {"/scoring/passage/lse", "expected shape [9], got a scalar"});

  // full_logits must be [n_full_steps, n_vocab].
  const std::string p3 =
      broken("nfull.h5", [](hid_t f) { set_attr_i32(f, "/cases/alpha", "n_full_steps", 3); });
  expect_read_error(p3, {"/cases/alpha/full_logits", "expected shape [3, 50], got [4, 50]"});

  const std::string p4 =
      broken("nfull2.h5", [](hid_t f) { set_attr_i32(f, "/cases/alpha", "n_full_steps", 5); });
  expect_read_error(p4, {"/cases/alpha@n_full_steps", "exceeds G = 4"});
}

TEST_F(GoldenTest, ReadRejectsMissingObjectsAndWrongTypes) {
  expect_read_error(
      broken("nolse.h5", [](hid_t f) { H5Ldelete(f, "/cases/alpha/lse", H5P_DEFAULT); }),
      {"/cases/alpha/lse", "missing dataset"});
  expect_read_error(broken("nomodel.h5", [](hid_t f) { H5Adelete(f, "model_name"); }),
                    {"/@model_name", "missing attribute"});
  expect_read_error(broken("noscoring.h5", [](hid_t f) { H5Ldelete(f, "/scoring", H5P_DEFAULT); }),
                    {"/scoring", "missing group"});
  expect_read_error(broken("dtype.h5",
                           [](hid_t f) {
                             H5Ldelete(f, "/cases/zeta/greedy_ids", H5P_DEFAULT);
                             hid_t g = H5Gopen2(f, "/cases/zeta", H5P_DEFAULT);
                             hsize_t n = 8;
                             std::vector<int64_t> v(8, 1);
                             hid_t sp = H5Screate_simple(1, &n, nullptr);
                             hid_t d = H5Dcreate2(g, "greedy_ids", H5T_STD_I64LE, sp, H5P_DEFAULT,
                                                  H5P_DEFAULT, H5P_DEFAULT);
                             H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
                             H5Dclose(d);
                             H5Sclose(sp);
                             H5Gclose(g);
                           }),
                    {"/cases/zeta/greedy_ids", "wrong dtype: expected int32, got int64"});
  expect_read_error(
      broken("version.h5", [](hid_t f) { set_attr_i32(f, "/", "format_version", 2); }),
      {"format_version", "unsupported format_version 2"});
  expect_read_error(broken("range.h5",
                           [](hid_t f) {
                             H5Ldelete(f, "/cases/alpha/topk_ids", H5P_DEFAULT);
                             hid_t g = H5Gopen2(f, "/cases/alpha", H5P_DEFAULT);
                             write_i32(g, "topk_ids", {4, 5}, 50);
                             H5Gclose(g);
                           }),
                    {"/cases/alpha/topk_ids[0]", "out of range [0, 50)"});
  expect_read_error(
      broken("topk.h5", [](hid_t f) { set_attr_i32(f, "/cases/alpha", "top_k", 51); }),
      {"/cases/alpha@top_k", "out of range"});
  expect_read_error(broken("notgroup.h5",
                           [](hid_t f) {
                             H5Ldelete(f, "/cases/alpha", H5P_DEFAULT);
                             hid_t g = H5Gopen2(f, "/cases", H5P_DEFAULT);
                             write_i32(g, "alpha", {2});
                             H5Gclose(g);
                           }),
                    {"/cases/alpha", "not a group"});
  expect_read_error(broken("strtype.h5",
                           [](hid_t f) {
                             H5Adelete(f, "model_name");
                             hid_t sp = H5Screate(H5S_SCALAR);
                             hid_t a = H5Acreate2(f, "model_name", H5T_STD_I32LE, sp, H5P_DEFAULT,
                                                  H5P_DEFAULT);
                             int32_t v = 3;
                             H5Awrite(a, H5T_NATIVE_INT32, &v);
                             H5Aclose(a);
                             H5Sclose(sp);
                           }),
                    {"/@model_name", "expected a string, got int32"});
}

// ---------------------------------------------------------------------------
// Goldens that cannot be swapped or broken (issue 10, section 2).

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
