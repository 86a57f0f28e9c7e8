// libFuzzer target: the GGUF reader (model/gguf). Any input must open or
// throw touchstone::Error; for a file that opens, every accessor and the
// dequantization of every tensor (bounded to kMaxElements) must work or throw
// Error, and the tokenizer data read from it must build a Tokenizer or throw.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.h"
#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/quant.h"
#include "touchstone/model/tokenizer.h"

namespace {
constexpr uint64_t kMaxElements = uint64_t{1} << 20;  // bounds memory and time per input
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::MemFile file("gguf_fuzz");
  using namespace touchstone::gguf;
  try {
    const File f = File::open(file.write(data, size));
    for (const auto& [key, value] : f.metadata()) {
      (void)value.type_string();
      if (!f.has(key)) std::abort();  // every listed key must be found again
      try {
        (void)f.get_string(key);
      } catch (const touchstone::Error&) {
      }
      try {
        (void)f.get_int_array(key);
      } catch (const touchstone::Error&) {
      }
    }
    for (const TensorInfo& t : f.tensors()) {
      if (f.find_tensor(t.name) != &t) std::abort();
      try {
        const auto bytes = f.tensor_data(t);
        if (bytes.size() != t.n_bytes) std::abort();
        if (!can_dequantize(t.type) || t.n_elements > kMaxElements) continue;
        const std::vector<float> v = dequantize(f, t);
        if (v.size() != t.n_elements) std::abort();
      } catch (const touchstone::Error&) {
      }
    }
    try {
      const touchstone::Tokenizer tok(touchstone::tokenizer_data_from_gguf(f));
      (void)tok.encode("Hello, world! <|im_start|>", true, true);
    } catch (const touchstone::Error&) {
    }
  } catch (const touchstone::Error&) {
  }
  return 0;
}
