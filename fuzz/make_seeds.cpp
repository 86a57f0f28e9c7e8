// make_seeds.cpp - writes the generated seed inputs of the committed corpora
// (fuzz/corpus/<target>/seed_*): tiny GGUF files (built with
// model/gguf/tests/gguf_builder.h), a tiny golden (write_golden_file) and
// child-process protocol frames (protocol.h's encoders). Run by hand from the
// repository root after a format change:  build/fuzz/make_seeds fuzz/corpus
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "../model/gguf/tests/gguf_builder.h"
#include "touchstone/golden/golden.h"
#include "touchstone/runtime/protocol.h"

namespace tg = touchstone::gguf;
using tg::testing::GgufBuilder;

namespace {

void save(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

void save(const std::string& path, const std::string& bytes) {
  save(path, std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 37);
  return v;
}

void gguf_seeds(const std::string& dir) {
  {  // metadata of every scalar kind + an F32 and an F16 tensor
    GgufBuilder b;
    b.key("general.architecture", tg::ValueType::STRING).str("llama");
    b.key("general.alignment", tg::ValueType::UINT32).put<uint32_t>(32);
    b.key("llama.block_count", tg::ValueType::UINT64).put<uint64_t>(1);
    b.key("x.f", tg::ValueType::FLOAT32).put<float>(1.5f);
    b.key("x.b", tg::ValueType::BOOL).put<uint8_t>(1);
    b.key("x.a", tg::ValueType::ARRAY)
        .put<uint32_t>(5)
        .put<uint64_t>(2)
        .put<int32_t>(-1)
        .put<int32_t>(7);
    std::vector<uint8_t> f32(8 * 4);
    for (size_t i = 0; i < 8; ++i) {
      const float v = static_cast<float>(i) * 0.25f;
      std::memcpy(&f32[i * 4], &v, 4);
    }
    b.tensor("a.weight", {4, 2}, tg::TensorType::F32, f32);
    b.tensor("b.weight", {8}, tg::TensorType::F16, pattern(16, 3));
    save(dir + "/seed_f32_f16", b.build());
  }
  {  // one block of each common quantized type
    GgufBuilder b;
    b.tensor("q4_0", {32}, tg::TensorType::Q4_0, pattern(18, 1));
    b.tensor("q4_1", {32}, tg::TensorType::Q4_1, pattern(20, 2));
    b.tensor("q8_0", {32}, tg::TensorType::Q8_0, pattern(34, 3));
    b.tensor("q5_1", {32}, tg::TensorType::Q5_1, pattern(24, 4));
    save(dir + "/seed_quant", b.build());
  }
  {  // K-quants and IQ types (one super-block each)
    GgufBuilder b;
    b.tensor("q4_k", {256}, tg::TensorType::Q4_K, pattern(144, 5));
    b.tensor("q6_k", {256}, tg::TensorType::Q6_K, pattern(210, 6));
    b.tensor("iq4_nl", {32}, tg::TensorType::IQ4_NL, pattern(18, 7));
    save(dir + "/seed_kquant", b.build());
  }
  {  // a byte-level BPE tokenizer
    GgufBuilder b;
    b.key("tokenizer.ggml.model", tg::ValueType::STRING).str("gpt2");
    b.key("tokenizer.ggml.pre", tg::ValueType::STRING).str("smollm");
    auto& t = b.key("tokenizer.ggml.tokens", tg::ValueType::ARRAY);
    t.put<uint32_t>(8).put<uint64_t>(6);
    for (const char* s : {"<|im_start|>", "a", "b", "ab", "H", "e"}) t.str(s);
    auto& ty = b.key("tokenizer.ggml.token_type", tg::ValueType::ARRAY);
    ty.put<uint32_t>(5).put<uint64_t>(6);
    for (int32_t v : {3, 1, 1, 1, 1, 1}) ty.put<int32_t>(v);
    auto& m = b.key("tokenizer.ggml.merges", tg::ValueType::ARRAY);
    m.put<uint32_t>(8).put<uint64_t>(1).str("a b");
    b.key("tokenizer.ggml.bos_token_id", tg::ValueType::UINT32).put<uint32_t>(0);
    save(dir + "/seed_tokenizer", b.build());
  }
}

void golden_seeds(const std::string& dir) {
  touchstone::GoldenFile g;
  g.model_name = "tiny";
  g.model_sha256 = std::string(64, 'a');
  g.reference_version = "0.1.0";
  g.reference_revision = "seed";
  touchstone::GoldenCase c;
  c.name = "c1";
  c.prompt_text = "Hi";
  c.prompt_ids = {1, 2};
  c.greedy_ids = {3, 0};
  c.greedy_text = "xy";
  c.n_vocab = 4;
  c.top_k = 2;
  c.n_full_steps = 1;
  c.full_logits = {0.5f, -1.f, 0.f, 2.f};
  c.topk_ids = {3, 0, 0, 1};
  c.topk_logits = {2.f, 0.5f, 1.f, 0.f};
  c.lse = {2.4, 1.3};
  g.cases.push_back(c);
  touchstone::GoldenScoring s;
  s.name = "p1";
  s.text = "ab";
  s.token_ids = {1, 2};
  s.n_vocab = 4;
  s.top_k = 1;
  s.topk_ids = {2};
  s.topk_logits = {1.f};
  s.lse = {1.5};
  s.target_logits = {1.f};
  g.scoring.push_back(s);
  touchstone::write_golden_file(dir + "/seed_tiny.h5", g);
}

void protocol_seeds(const std::string& dir) {
  namespace p = touchstone::protocol;
  p::Writer hello;
  p::BackendInfo info;
  info.api_version = 2;
  info.name = "reference";
  info.version = "0.1.0";
  info.path = "/x/lib.so";
  info.device = "cpu";
  p::encode(hello, info);
  save(dir + "/seed_hello", p::frame(1 | p::kReplyBit, hello.bytes()));
  p::Writer caps;
  ts_capabilities c{};
  c.max_context = 2048;
  p::encode(caps, c);
  save(dir + "/seed_caps", p::frame(2 | p::kReplyBit, caps.bytes()));
  p::Writer logits;
  const float l[3] = {1.f, -2.f, 0.5f};
  logits.i32(0).f32s(l);
  save(dir + "/seed_logits", p::frame(8 | p::kReplyBit, logits.bytes()));
  p::Writer err;
  err.i32(3).str("backend error");
  save(dir + "/seed_error", p::frame(8 | p::kReplyBit, err.bytes()));
  p::Writer batch;
  const int32_t a[1] = {7}, b[3] = {1, 2, 3};
  const p::BatchEntry entries[2] = {{1, false, a}, {2, true, b}};
  p::encode_step_batch(batch, entries);
  save(dir + "/seed_step_batch", p::frame(uint32_t(p::Op::kStepBatch), batch.bytes()));
  p::Writer fork;
  p::encode(fork, p::ForkRequest{1, 2});
  save(dir + "/seed_fork", p::frame(uint32_t(p::Op::kForkSession), fork.bytes()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR (fuzz/corpus)\n");
    return 2;
  }
  const std::string root = argv[1];
  gguf_seeds(root + "/gguf_fuzz");
  golden_seeds(root + "/golden_fuzz");
  protocol_seeds(root + "/protocol_fuzz");
  return 0;
}
