// model_facts.h - what the harness side reads from a model's GGUF (its chat
// template, its tokenizer, its architecture), read once per file per process.
//
// The harness computes with a model's weights only in the routing diagnosis of a
// mixture-of-experts model (moe_routing.h; the backend computes, in its own process),
// yet a parity run needs three things from the file's metadata;
// gguf::File::open reads the whole file into private memory (98 MB for
// SmolLM2, 253 MB for Gemma 3 270M), so reading it once instead of once per
// use saves that copy and parse twice per run. The File itself is dropped once
// the facts are taken.
#pragma once

#include <optional>
#include <string>

#include "touchstone/harness/chat.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/tokenizer.h"

namespace touchstone {

struct ModelFacts {
  ChatTemplate chat;
  TokenizerData tokenizer;
  // nullopt when the reference cannot describe the model (an architecture it
  // does not know): a backend's load_model decides then.
  std::optional<ModelConfig> config;
};

// The facts of the GGUF at `gguf_path`, read on the first call for that path
// and kept for the life of the process. Throws touchstone::Error (naming the
// file and offset) when the file cannot be read as a GGUF, as gguf::File::open.
// Thread-safe (one lock around the cache; a first read holds it).
const ModelFacts& model_facts(const std::string& gguf_path);

}  // namespace touchstone
