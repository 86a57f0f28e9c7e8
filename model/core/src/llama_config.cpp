#include "touchstone/model/llama_config.h"

#include "touchstone/model/gguf.h"

namespace touchstone {

ModelConfig read_llama_config(const gguf::File& f) {
  ModelConfig c = read_model_config(f);
  if (!c.is_plain_llama()) {
    throw UnsupportedModel(
        "{}: not supported by this backend: {} (it computes plain Llama-family "
        "models only)",
        f.path(), c.extra_features());
  }
  return c;
}

}  // namespace touchstone
