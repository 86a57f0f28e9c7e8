// touchstone/runtime/protocol.h - the child-process protocol (docs/protocol.md).
//
// The harness runs a backend in a child process (`touchstone-backend-runner`)
// and talks to it over one stream socket. Every message is a frame:
//
//   u32 magic 'TSP1' | u32 op | u64 payload_len | payload[payload_len]
//
// All integers little-endian (both ends run on the same host; the codec
// writes and reads them byte by byte, so it is explicit either way). A reply
// carries op | kReplyBit and its payload starts with an i32 ts_status; a status
// other than TS_OK is followed by the backend's error text, TS_OK by the op's
// results. Strings are u32 length + bytes. The calls and status codes are the
// C ABI's (touchstone/abi/backend_abi.h); the protocol adds nothing a backend can
// do in process, so a runner is a thin loop around the loaded table.
//
// Decoding is bounds-checked everywhere: a short, over-long or malformed
// payload throws ProtocolError naming the op and the field; a frame header
// whose length exceeds the caller's limit is refused before anything is
// allocated.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "touchstone/abi/backend_abi.h"
#include "touchstone/common/error.h"

namespace touchstone::protocol {

// 2: BackendInfo carries the declared models; 3: layer taps (kSetTaps, kReadTaps);
// 4: ABI v6 serving calls (kStepBatch, kForkSession), BackendInfo.step_batch /
// fork, ts_capabilities.batch_invariant_paths / max_batch; 5: ABI v7 structured
// output (kSetGrammar, kGrammarMask, kGrammarGreedy), BackendInfo.grammar; 6: ABI v8
// multimodal (kPrefillEmbeddings, kLoadVision, kEncodeImage), BackendInfo.embeddings /
// vision; 7: ABI v9 preprocessing (kPreprocessImage, kSetVisionOptions),
// BackendInfo.preprocess / vision_options.
inline constexpr uint32_t kVersion = 7;
// The oldest version either end still speaks: the hello reply carries
// min(the harness's version, the child's), and an older peer simply has none of
// the newer ops or fields (the harness never sends them).
inline constexpr uint32_t kMinVersion = 3;
// The version a child answers a hello asking for `requested` with.
uint32_t negotiate(uint32_t requested);
inline constexpr uint32_t kMagic = 0x31505354;  // bytes "TSP1"
inline constexpr uint32_t kReplyBit = 0x8000;
inline constexpr size_t kHeaderSize = 16;
// Largest payload either side accepts unless it expects a known larger size:
// requests are small; logits replies are checked against the exact size.
inline constexpr uint64_t kMaxRequestPayload = 64ull << 20;
// Largest logits reply (prefill, step_batch) a runner sizes a buffer for: a
// request asking for more is refused before anything is allocated.
inline constexpr uint64_t kMaxLogitsReply = 4ull << 30;

enum class Op : uint32_t {
  kHello = 1,           // -> u32 protocol version; reply: BackendInfo
  kCapabilities = 2,    // -> ; reply: ts_capabilities fields
  kLoadModel = 3,       // -> str path; reply: u64 model, i32 n_vocab
  kFreeModel = 4,       // -> u64 model; reply: status only
  kOpenSession = 5,     // -> u64 model, i32 weight_path, i32 n_threads, i32 max_context, str fault
                        //    (empty = none); reply: u64 session
  kFreeSession = 6,     // -> u64 session; reply: status only
  kPrefill = 7,         // -> u64 session, i32 all_positions, i32 n, i32 tokens[n];
                        //    reply: f32 logits[n_vocab or n * n_vocab]
  kDecode = 8,          // -> u64 session, i32 token; reply: f32 logits[n_vocab]
  kRewind = 9,          // -> u64 session, i32 position; reply: status only
  kPosition = 10,       // -> u64 session; reply: i32 position
  kPrefillGreedy = 11,  // -> u64 session, i32 n, i32 tokens[n]; reply: i32 token
  kSetTaps = 12,        // -> u64 session, i32 enable; reply: status only
  kReadTaps = 13,       // -> u64 session, u64 n_floats; reply: f32 taps[n_floats]
  // ---- version 4 (ABI v6) ----
  kStepBatch = 14,    // -> u32 n_entries, then per entry: u64 session, i32 all_positions,
                      //    i32 n_tokens, i32 tokens[n_tokens]; reply: the entries' logits
                      //    concatenated in entry order (n_vocab or n_tokens * n_vocab f32 each)
  kForkSession = 15,  // -> u64 src session, i32 n_prefix; reply: u64 session
  // ---- version 5 (ABI v7) ----
  kSetGrammar = 16,     // -> u64 session, i32 kind (-1 = remove), str text; reply: status only
  kGrammarMask = 17,    // -> u64 session, i32 n_words; reply: u32 words[n_words]
  kGrammarGreedy = 18,  // -> u64 session, i32 n_positions; reply: i32 tokens[n_positions]
  // ---- version 6 (ABI v8) ----
  kPrefillEmbeddings = 19,  // -> u64 session, i32 all_positions, i32 n, i32 n_embd,
                            //    i32 bidirectional, f32 embeddings[n * n_embd];
                            //    reply: f32 logits[n_vocab or n * n_vocab]
  kLoadVision = 20,         // -> u64 model, str mmproj path; reply: status only
  kEncodeImage = 21,        // -> u64 model, i32 format, i32 channels, i32 height, i32 width,
                            //    u64 n_floats, then the image: f32 [channels][height][width]
                            //    (TS_IMAGE_PIXELS_F32) or u8 [height][width][channels]
                            //    (TS_IMAGE_RGB8); reply: f32 out[n_floats]
  // ---- version 7 (ABI v9) ----
  kPreprocessImage = 22,  // -> u64 model, i32 channels, i32 height, i32 width, then the
                          //    image: u8 [height][width][channels]; reply: i32 n_frames,
                          //    i32 channels, i32 height, i32 width, f32 pixels[the product]
  kSetVisionOptions = 23  // -> u64 model, str fault (empty = none); reply: status only
};
const char* op_name(uint32_t op);

// A status the runner itself reports (never a backend's): the backend broke
// the contract in a way the runner detected (wrote past its logits buffer,
// returned TS_OK with an impossible value). The harness treats it as a crash.
inline constexpr int32_t kStatusContractViolation = 1000;

class ProtocolError : public Error {
 public:
  using Error::Error;
};

struct FrameHeader {
  uint32_t magic = 0, op = 0;
  uint64_t payload_len = 0;
};
// Parses the 16 header bytes; throws ProtocolError on a wrong magic or a
// payload_len above `max_payload` (nothing is allocated before this check).
FrameHeader parse_header(std::span<const uint8_t> bytes, uint64_t max_payload);
// Header + payload, ready to send.
std::string frame(uint32_t op, std::string_view payload);

class Writer {
 public:
  Writer& u32(uint32_t v);
  Writer& i32(int32_t v) { return u32(static_cast<uint32_t>(v)); }
  Writer& u64(uint64_t v);
  Writer& str(std::string_view s);
  Writer& i32s(std::span<const int32_t> v);  // raw, no count
  Writer& f32s(std::span<const float> v);    // raw, no count
  Writer& u8s(std::span<const uint8_t> v);   // raw, no count
  const std::string& bytes() const { return buf_; }

 private:
  std::string buf_;
};

class Reader {
 public:
  // `what` names the message in errors ("decode reply").
  Reader(std::span<const uint8_t> bytes, std::string what) : b_(bytes), what_(std::move(what)) {}
  uint32_t u32(const char* field);
  int32_t i32(const char* field) { return static_cast<int32_t>(u32(field)); }
  uint64_t u64(const char* field);
  // `max_len` bounds the string before it is copied.
  std::string str(const char* field, uint32_t max_len = 1u << 20);
  void i32s(const char* field, std::span<int32_t> out);
  void f32s(const char* field, std::span<float> out);
  void u8s(const char* field, std::span<uint8_t> out);
  size_t remaining() const { return b_.size() - pos_; }
  // Throws unless every byte was consumed.
  void finish();

 private:
  std::span<const uint8_t> take(size_t n, const char* field);
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  std::string what_;
};

// What the runner says about the backend it loaded (reply to kHello).
struct BackendInfo {
  uint32_t protocol_version = kVersion;
  uint32_t api_version = 0;
  std::string name, version, path, device;
  bool device_greedy = false;  // version >= 2 table claiming TS_CAP_DEVICE_GREEDY with the entry
  // api_version >= 3 with non-NULL architectures: what the backend computes
  // (ts_backend.architectures / model_features, comma-separated).
  bool declares_models = false;
  std::string architectures, model_features;
  // api_version >= 4 with both set_taps and read_taps: layer taps.
  bool taps = false;
  // api_version >= 6 (protocol >= 4): step_batch / fork_session are set.
  bool step_batch = false;
  bool fork = false;
  // api_version >= 7 (protocol >= 5): set_grammar, grammar_mask, grammar_greedy set.
  bool grammar = false;
  // api_version >= 8 (protocol >= 6): prefill_embeddings set; load_vision and
  // encode_image both set.
  bool embeddings = false;
  bool vision = false;
  // api_version >= 9 (protocol >= 7): preprocess_image / set_vision_options set.
  bool preprocess = false;
  bool vision_options = false;
};
// The fields a version added are written and read only when
// info.protocol_version (the first field) is at least that version.
void encode(Writer& w, const BackendInfo& info);
BackendInfo decode_info(Reader& r);

// ts_capabilities on the wire: u32 flags, u64 weight_types, i32 max_context,
// i32 n_shape_buckets (0..16), i32 buckets[n], str determinism_note ("" = NULL),
// i32 top_n (ABI v5), then with protocol >= 4: u32 batch_invariant_paths, i32
// max_batch (ABI v6). decode_capabilities keeps the note's bytes in
// `note_storage`; fields a reply ends before are 0 and drop their flags
// (top_n: TS_CAP_TOP_N_LOGPROBS; the v6 fields: TS_CAP_BATCH_INVARIANT,
// TS_CAP_BATCHED_SESSIONS and TS_CAP_KV_PREFIX_COPY, which meant something
// looser before ABI v6).
void encode(Writer& w, const ts_capabilities& caps, uint32_t version = kVersion);
ts_capabilities decode_capabilities(Reader& r, std::string& note_storage,
                                    uint32_t version = kVersion);

// kStepBatch request. The decoder bounds n_entries (1..kMaxBatchEntries) and
// every n_tokens by the bytes left before allocating anything.
inline constexpr uint32_t kMaxBatchEntries = 1u << 16;
struct BatchEntry {
  uint64_t session = 0;
  bool all_positions = false;
  std::span<const int32_t> tokens;
};
struct DecodedBatchEntry {
  uint64_t session = 0;
  bool all_positions = false;
  std::vector<int32_t> tokens;
};
void encode_step_batch(Writer& w, std::span<const BatchEntry> entries);
std::vector<DecodedBatchEntry> decode_step_batch(Reader& r);

// kForkSession request.
struct ForkRequest {
  uint64_t session = 0;
  int32_t n_prefix = 0;
};
void encode(Writer& w, const ForkRequest& f);
ForkRequest decode_fork(Reader& r);

}  // namespace touchstone::protocol
