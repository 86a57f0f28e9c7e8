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
#include <string>

#include "golden_fixture.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/golden.h"

using namespace golden_testing;  // NOLINT(google-build-using-namespace): test helpers

namespace {

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
  EXPECT_EQ(r.format_version, touchstone::kGoldenTextFormatVersion);
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

// Format 2: layer taps round-trip bit for bit, are validated and diffed;
// a version-1 file (no taps) is still read.
TEST_F(GoldenTest, LayerTapsRoundTripValidateAndDiff) {
  GoldenFile g = make_golden();
  GoldenCase& c = g.cases[0];
  ASSERT_GE(c.greedy_ids.size(), 2u);
  c.tap_steps = {0, 1};
  c.tap_layers = 3;
  c.tap_dim = 5;
  for (size_t i = 0; i < 2 * c.tap_record_size(); ++i) c.taps.push_back(0.25f * float(i) - 3.0f);
  touchstone::write_golden_file(path("t.h5"), g);
  const GoldenFile r = touchstone::read_golden_file(path("t.h5"));
  EXPECT_TRUE(touchstone::diff_golden(g, r).empty());
  EXPECT_EQ(r.cases[0].tap_steps, c.tap_steps);
  EXPECT_EQ(r.cases[0].tap_layers, 3);
  EXPECT_EQ(r.cases[0].tap_dim, 5);
  EXPECT_TRUE(same_bytes(r.cases[0].taps, c.taps));
  EXPECT_TRUE(r.cases[1].taps.empty());

  GoldenFile flipped = g;
  flipped.cases[0].taps[7] = -flipped.cases[0].taps[7];
  const auto d = touchstone::diff_golden(g, flipped);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("taps"), std::string::npos) << d[0];

  GoldenFile bad = g;
  bad.cases[0].taps.pop_back();
  EXPECT_THROW(touchstone::write_golden_file(path("bad.h5"), bad), Error);
  bad = g;
  bad.cases[0].tap_steps = {1, 1};
  EXPECT_THROW(touchstone::write_golden_file(path("bad.h5"), bad), Error);
  bad = g;
  bad.cases[0].tap_steps = {0, int32_t(c.greedy_ids.size())};
  EXPECT_THROW(touchstone::write_golden_file(path("bad.h5"), bad), Error);

  GoldenFile v1 = make_golden();
  v1.format_version = 1;
  touchstone::write_golden_file(path("v1.h5"), v1);
  EXPECT_EQ(touchstone::read_golden_file(path("v1.h5")).format_version, 1);
  v1.cases[0].tap_steps = {0};
  v1.cases[0].tap_layers = v1.cases[0].tap_dim = 1;
  v1.cases[0].taps = {0.f, 0.f, 0.f};
  EXPECT_THROW(touchstone::write_golden_file(path("v1t.h5"), v1), Error)
      << "taps need format_version 2";
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
      broken("version.h5", [](hid_t f) { set_attr_i32(f, "/", "format_version", 99); }),
      {"format_version", "unsupported format_version 99"});
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

namespace {

// The golden's first case given an image of `frames` frames of 2 rows of width 3.
GoldenFile with_image(std::vector<int32_t> frames) {
  GoldenFile g = make_golden();
  GoldenCase& c = g.cases[0];
  c.image_at = frames[0];
  c.image_tokens = 2 * int32_t(frames.size());
  c.image_dim = 3;
  for (int32_t i = 0; i < c.image_tokens * c.image_dim; ++i)
    c.image_embeddings.push_back(0.25f * float(i));
  c.image_sha256 = c.pixels_sha256 = c.mmproj_sha256 = std::string(64, 'a');
  if (frames.size() > 1) c.image_frames = std::move(frames);
  g.format_version = g.needed_format();
  return g;
}

}  // namespace

// Format 4: an image of several frames (Idefics3's tiles) keeps where each goes; a file
// is written in the lowest version its images need.
TEST_F(GoldenTest, ImageFramesRoundTripInFormat4) {
  const GoldenFile one = with_image({2});
  EXPECT_EQ(one.format_version, touchstone::kGoldenImageFormatVersion);
  const GoldenFile g = with_image({1, 3, 3, 5});
  EXPECT_EQ(g.format_version, touchstone::kGoldenFormatVersion);
  const std::string p = path("frames.h5");
  touchstone::write_golden_file(p, g);
  const GoldenFile r = touchstone::read_golden_file(p);
  EXPECT_TRUE(touchstone::diff_golden(g, r).empty());
  EXPECT_EQ(r.format_version, 4);
  EXPECT_EQ(r.cases[0].frame_positions(), (std::vector<int32_t>{1, 3, 3, 5}));
  EXPECT_EQ(r.cases[0].frame_rows(), 2);
  EXPECT_EQ(one.cases[0].frame_positions(), (std::vector<int32_t>{2}));
}

TEST_F(GoldenTest, ImageFramesOutOfOrderOrPastThePromptAreRefused) {
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{1, 4, 3}, {1, 3, 6}}) {
    const GoldenFile g = with_image(bad);  // the first case's prompt has 6 ids
    EXPECT_THROW(touchstone::validate_golden(g, "x.h5"), touchstone::Error) << bad[1];
  }
  GoldenFile three = with_image({1, 3});
  three.format_version = 3;  // frames need format 4
  EXPECT_THROW(touchstone::validate_golden(three, "x.h5"), touchstone::Error);
  GoldenFile odd = with_image({1, 3});
  odd.cases[0].image_tokens = 3;  // 3 rows do not divide into 2 frames
  odd.cases[0].image_embeddings.resize(9);
  EXPECT_THROW(touchstone::validate_golden(odd, "x.h5"), touchstone::Error);
}
