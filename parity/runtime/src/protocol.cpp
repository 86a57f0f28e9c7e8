#include "touchstone/protocol.h"

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
  }
  return "unknown op";
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

void Reader::finish() {
  if (remaining() != 0) {
    throw ProtocolError("{}: {} unexpected trailing bytes at offset {}", what_, remaining(), pos_);
  }
}

void encode(Writer& w, const BackendInfo& info) {
  w.u32(info.protocol_version).u32(info.api_version);
  w.str(info.name).str(info.version).str(info.path).str(info.device);
  w.u32(info.device_greedy ? 1 : 0);
  w.u32(info.declares_models ? 1 : 0).str(info.architectures).str(info.model_features);
  w.u32(info.taps ? 1 : 0);
}

BackendInfo decode_info(Reader& r) {
  BackendInfo i;
  i.protocol_version = r.u32("protocol_version");
  i.api_version = r.u32("api_version");
  i.name = r.str("name", 4096);
  i.version = r.str("version", 4096);
  i.path = r.str("path", 1u << 16);
  i.device = r.str("device", 1u << 16);
  i.device_greedy = r.u32("device_greedy") != 0;
  i.declares_models = r.u32("declares_models") != 0;
  i.architectures = r.str("architectures", 4096);
  i.model_features = r.str("model_features", 4096);
  i.taps = r.u32("taps") != 0;
  return i;
}

void encode(Writer& w, const ts_capabilities& c) {
  w.u32(c.flags).u64(c.weight_types).i32(c.max_context);
  const int32_t n = c.n_shape_buckets < 0 ? 0 : (c.n_shape_buckets > 16 ? 16 : c.n_shape_buckets);
  w.i32(n);
  w.i32s(std::span<const int32_t>(c.shape_buckets, size_t(n)));
  w.str(c.determinism_note ? c.determinism_note : "");
  w.i32(c.top_n);  // ABI v5; optional on the wire (a Python engine may end before it)
}

ts_capabilities decode_capabilities(Reader& r, std::string& note_storage) {
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
  return c;
}

}  // namespace touchstone::protocol
