// libFuzzer target: the child-process protocol decoder (touchstone/runtime/protocol.h)
// as the harness runs it on a runner's replies: header, then each reply kind;
// and as the runner runs it on the harness's step_batch / fork_session requests.
// Any input must decode or throw ProtocolError; nothing else.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "touchstone/runtime/protocol.h"

using namespace touchstone::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  try {
    if (size >= kHeaderSize) (void)parse_header(in.first(kHeaderSize), kMaxRequestPayload);
  } catch (const ProtocolError&) {
  }
  const std::span<const uint8_t> body = size > kHeaderSize ? in.subspan(kHeaderSize) : in;
  try {
    Reader r(body, "hello reply");
    (void)decode_info(r);
    r.finish();
  } catch (const ProtocolError&) {
  }
  try {
    std::string note;
    Reader r(body, "capabilities reply");
    (void)decode_capabilities(r, note);
    r.finish();
  } catch (const ProtocolError&) {
  }
  try {  // a version-3 peer's capabilities: ends after top_n
    std::string note;
    Reader r(body, "capabilities reply");
    (void)decode_capabilities(r, note, 3);
    r.finish();
  } catch (const ProtocolError&) {
  }
  // The runner's side: a step_batch request (n_entries and every n_tokens are
  // bounded before anything is allocated) and a fork_session request.
  try {
    Reader r(body, "step_batch request");
    (void)decode_step_batch(r);
  } catch (const ProtocolError&) {
  }
  try {
    Reader r(body, "fork_session request");
    (void)decode_fork(r);
  } catch (const ProtocolError&) {
  }
  try {  // a logits reply: status, then exactly n floats
    Reader r(body, "decode reply");
    if (r.i32("status") != 0) {
      (void)r.str("error");
    } else {
      std::vector<float> out(r.remaining() / 4);
      r.f32s("logits", out);
    }
    r.finish();
  } catch (const ProtocolError&) {
  }
  return 0;
}
