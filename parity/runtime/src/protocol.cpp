#include "touchstone/runtime/protocol.h"

#include <bit>
#include <cstring>

namespace touchstone::protocol {
namespace {

uint64_t load_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void store_le(std::string& buf, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) buf.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

const char* op_name(uint32_t op) {
  switch (static_cast<Op>(op & ~kReplyBit)) {
    case Op::kHello:
      return "hello";
    case Op::kCapabilities:
      return "capabilities";
    case Op::kLoadModel:
      return "load_model";
    case Op::kFreeModel:
      return "free_model";
    case Op::kOpenSession:
      return "open_session";
    case Op::kFreeSession:
      return "free_session";
    case Op::kPrefill:
      return "prefill";
    case Op::kDecode:
      return "decode";
    case Op::kRewind:
      return "rewind";
    case Op::kPosition:
      return "position";
    case Op::kPrefillGreedy:
      return "prefill_greedy";
    case Op::kSetTaps:
      return "set_taps";
    case Op::kReadTaps:
      return "read_taps";
    case Op::kStepBatch:
      return "step_batch";
    case Op::kForkSession:
      return "fork_session";
    case Op::kSetGrammar:
      return "set_grammar";
    case Op::kGrammarMask:
      return "grammar_mask";
    case Op::kGrammarGreedy:
      return "grammar_greedy";
    case Op::kPrefillEmbeddings:
      return "prefill_embeddings";
    case Op::kLoadVision:
      return "load_vision";
    case Op::kEncodeImage:
      return "encode_image";
    case Op::kPreprocessImage:
      return "preprocess_image";
    case Op::kSetVisionOptions:
      return "set_vision_options";
  }
  return "unknown op";
}

uint32_t negotiate(uint32_t requested) {
  // An older harness gets its own version back; a newer one, or one older than
  // kMinVersion, gets ours and decides (it refuses a version it cannot speak).
  return requested >= kMinVersion && requested < kVersion ? requested : kVersion;
}

FrameHeader parse_header(std::span<const uint8_t> bytes, uint64_t max_payload) {
  if (bytes.size() != kHeaderSize) {
    throw ProtocolError("frame header: {} bytes, expected {}", bytes.size(), kHeaderSize);
  }
  FrameHeader h;
  h.magic = static_cast<uint32_t>(load_le(bytes.data(), 4));
  h.op = static_cast<uint32_t>(load_le(bytes.data() + 4, 4));
  h.payload_len = load_le(bytes.data() + 8, 8);
  if (h.magic != kMagic) {
    throw ProtocolError("frame header: magic 0x{:08x}, expected 0x{:08x} ('TSP1')", h.magic,
                        kMagic);
  }
  if (h.payload_len > max_payload) {
    throw ProtocolError("frame header ({}): payload of {} bytes exceeds the limit of {}",
                        op_name(h.op), h.payload_len, max_payload);
  }
  return h;
}

std::string frame(uint32_t op, std::string_view payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  store_le(out, kMagic, 4);
  store_le(out, op, 4);
  store_le(out, payload.size(), 8);
  out.append(payload);
  return out;
}

Writer& Writer::u32(uint32_t v) {
  store_le(buf_, v, 4);
  return *this;
}

Writer& Writer::u64(uint64_t v) {
  store_le(buf_, v, 8);
  return *this;
}

Writer& Writer::str(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  buf_.append(s);
  return *this;
}

Writer& Writer::i32s(std::span<const int32_t> v) {
  for (int32_t x : v) i32(x);
  return *this;
}

Writer& Writer::f32s(std::span<const float> v) {
  // Bulk copy: both ends are the same host, and x86/ARM Linux are little-endian
  // (checked at compile time below), so a float's bytes are its wire bytes.
  static_assert(std::endian::native == std::endian::little, "protocol assumes little-endian");
  buf_.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
  return *this;
}

Writer& Writer::u8s(std::span<const uint8_t> v) {
  buf_.append(reinterpret_cast<const char*>(v.data()), v.size());
  return *this;
}

std::span<const uint8_t> Reader::take(size_t n, const char* field) {
  if (n > remaining()) {
    throw ProtocolError("{}: field '{}' needs {} bytes at offset {}, {} left", what_, field, n,
                        pos_, remaining());
  }
  const auto s = b_.subspan(pos_, n);
  pos_ += n;
  return s;
}

uint32_t Reader::u32(const char* field) {
  return static_cast<uint32_t>(load_le(take(4, field).data(), 4));
}

uint64_t Reader::u64(const char* field) { return load_le(take(8, field).data(), 8); }

std::string Reader::str(const char* field, uint32_t max_len) {
  const uint32_t n = u32(field);
  if (n > max_len) {
    throw ProtocolError("{}: string '{}' of {} bytes exceeds the limit of {}", what_, field, n,
                        max_len);
  }
  const auto s = take(n, field);
  return std::string(reinterpret_cast<const char*>(s.data()), s.size());
}

void Reader::i32s(const char* field, std::span<int32_t> out) {
  const auto s = take(out.size_bytes(), field);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<int32_t>(load_le(s.data() + 4 * i, 4));
}

void Reader::f32s(const char* field, std::span<float> out) {
  const auto s = take(out.size_bytes(), field);
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
}

void Reader::u8s(const char* field, std::span<uint8_t> out) {
  const auto s = take(out.size(), field);
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
}

void Reader::finish() {
  if (remaining() != 0) {
    throw ProtocolError("{}: {} unexpected trailing bytes at offset {}", what_, remaining(), pos_);
  }
}

void encode(Writer& w, const BackendInfo& info) {
  const uint32_t v = info.protocol_version;
  w.u32(v).u32(info.api_version);
  w.str(info.name).str(info.version).str(info.path).str(info.device);
  w.u32(info.device_greedy ? 1 : 0);
  if (v >= 2) w.u32(info.declares_models ? 1 : 0).str(info.architectures).str(info.model_features);
  if (v >= 3) w.u32(info.taps ? 1 : 0);
  if (v >= 4) w.u32(info.step_batch ? 1 : 0).u32(info.fork ? 1 : 0);
  if (v >= 5) w.u32(info.grammar ? 1 : 0);
  if (v >= 6) w.u32(info.embeddings ? 1 : 0).u32(info.vision ? 1 : 0);
  if (v >= 7) w.u32(info.preprocess ? 1 : 0).u32(info.vision_options ? 1 : 0);
}

BackendInfo decode_info(Reader& r) {
  BackendInfo i;
  i.protocol_version = r.u32("protocol_version");
  const uint32_t v = i.protocol_version;
  i.api_version = r.u32("api_version");
  i.name = r.str("name", 4096);
  i.version = r.str("version", 4096);
  i.path = r.str("path", 1u << 16);
  i.device = r.str("device", 1u << 16);
  i.device_greedy = r.u32("device_greedy") != 0;
  if (v >= 2) {
    i.declares_models = r.u32("declares_models") != 0;
    i.architectures = r.str("architectures", 4096);
    i.model_features = r.str("model_features", 4096);
  }
  if (v >= 3) i.taps = r.u32("taps") != 0;
  if (v >= 4) {
    i.step_batch = r.u32("step_batch") != 0;
    i.fork = r.u32("fork") != 0;
  }
  if (v >= 5) i.grammar = r.u32("grammar") != 0;
  if (v >= 6) {
    i.embeddings = r.u32("embeddings") != 0;
    i.vision = r.u32("vision") != 0;
  }
  if (v >= 7) {
    i.preprocess = r.u32("preprocess") != 0;
    i.vision_options = r.u32("vision_options") != 0;
  }
  return i;
}

void encode(Writer& w, const ts_capabilities& c, uint32_t version) {
  w.u32(c.flags).u64(c.weight_types).i32(c.max_context);
  const int32_t n = c.n_shape_buckets < 0 ? 0 : (c.n_shape_buckets > 16 ? 16 : c.n_shape_buckets);
  w.i32(n);
  w.i32s(std::span<const int32_t>(c.shape_buckets, size_t(n)));
  w.str(c.determinism_note ? c.determinism_note : "");
  w.i32(c.top_n);  // ABI v5; optional on the wire (a Python engine may end before it)
  if (version >= 4) w.u32(c.batch_invariant_paths).i32(c.max_batch);  // ABI v6
}

ts_capabilities decode_capabilities(Reader& r, std::string& note_storage, uint32_t version) {
  ts_capabilities c{};
  c.struct_size = sizeof(c);
  c.flags = r.u32("flags");
  c.weight_types = r.u64("weight_types");
  c.max_context = r.i32("max_context");
  c.n_shape_buckets = r.i32("n_shape_buckets");
  if (c.n_shape_buckets < 0 || c.n_shape_buckets > 16) {
    throw ProtocolError("capabilities reply: n_shape_buckets {} outside [0, 16]",
                        c.n_shape_buckets);
  }
  r.i32s("shape_buckets", std::span<int32_t>(c.shape_buckets, size_t(c.n_shape_buckets)));
  note_storage = r.str("determinism_note", 1u << 16);
  c.determinism_note = note_storage.empty() ? nullptr : note_storage.c_str();
  // ABI v5 top_n: present when the sender knows it; absent = 0, flag dropped.
  c.top_n = r.remaining() >= 4 ? r.i32("top_n") : 0;
  if (c.top_n <= 0) c.flags &= ~TS_CAP_TOP_N_LOGPROBS;
  // ABI v6 (protocol 4): absent = 0, and the v6 meanings of flags 2, 3 and 7 dropped.
  if (version >= 4 && r.remaining() >= 8) {
    c.batch_invariant_paths = r.u32("batch_invariant_paths");
    c.max_batch = r.i32("max_batch");
    if (c.max_batch < 0) throw ProtocolError("capabilities reply: max_batch {} < 0", c.max_batch);
  } else {
    c.flags &= ~(TS_CAP_BATCH_INVARIANT | TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY |
                 TS_CAP_BITWISE_NOT_ACROSS_FORKS);
  }
  // ABI v7 (protocol 5): an older peer has no grammar calls.
  if (version < 5) c.flags &= ~TS_CAP_STRUCTURED_OUTPUT;
  if (version < 6) c.flags &= ~(TS_CAP_EMBEDDING_INPUT | TS_CAP_MULTIMODAL);
  return c;
}

void encode_step_batch(Writer& w, std::span<const BatchEntry> entries) {
  w.u32(uint32_t(entries.size()));
  for (const BatchEntry& e : entries) {
    w.u64(e.session).i32(e.all_positions ? 1 : 0).i32(int32_t(e.tokens.size())).i32s(e.tokens);
  }
}

std::vector<DecodedBatchEntry> decode_step_batch(Reader& r) {
  constexpr size_t kEntryHeader = 8 + 4 + 4;  // session, all_positions, n_tokens
  const uint32_t n = r.u32("n_entries");
  if (n == 0 || n > kMaxBatchEntries || n > r.remaining() / kEntryHeader) {
    throw ProtocolError(
        "step_batch request: n_entries {} outside [1, {}] or more than {} bytes of entries hold "
        "(each needs {})",
        n, kMaxBatchEntries, r.remaining(), kEntryHeader);
  }
  std::vector<DecodedBatchEntry> out(n);
  for (uint32_t i = 0; i < n; ++i) {
    out[i].session = r.u64("session");
    out[i].all_positions = r.i32("all_positions") != 0;
    const int32_t k = r.i32("n_tokens");
    if (k < 0 || size_t(k) > r.remaining() / 4) {
      throw ProtocolError("step_batch request: entry {}: n_tokens {} for {} bytes left", i, k,
                          r.remaining());
    }
    out[i].tokens.resize(size_t(k));
    r.i32s("tokens", out[i].tokens);
  }
  r.finish();
  return out;
}

void encode(Writer& w, const ForkRequest& f) { w.u64(f.session).i32(f.n_prefix); }

ForkRequest decode_fork(Reader& r) {
  ForkRequest f;
  f.session = r.u64("session");
  f.n_prefix = r.i32("n_prefix");
  r.finish();
  return f;
}

}  // namespace touchstone::protocol
