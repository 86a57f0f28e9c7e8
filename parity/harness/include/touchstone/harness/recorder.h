// touchstone/harness/recorder.h - records goldens by running a backend (normally the reference).
#pragma once

#include "touchstone/harness/case_image.h"
#include "touchstone/harness/chat.h"

#include <functional>
#include <optional>
#include <string>

#include "touchstone/golden/golden.h"
#include "touchstone/golden/manifest.h"
#include "touchstone/grammar/oracle.h"
#include "touchstone/model/tokenizer.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {

struct RecordOptions {
  int32_t case_top_k = 64;   // K stored per greedy step
  int32_t n_full_steps = 2;  // steps whose full-vocabulary logits are stored (keeps goldens < 5 MB)
  int32_t scoring_top_k = 256;  // K stored per scored position
  // Layer taps (golden format 2), recorded when the backend has them and
  // tap_layers/tap_dim are set (the model's block_count / embedding_length).
  // Steps: the last prompt position (prefill), the first decode step (KV cache
  // written by prefill, read by decode) and one deeper decode step; ~200 KB per
  // step for SmolLM2 (30 layers x 3 x 576 floats).
  std::vector<int32_t> tap_steps = {0, 1, 8};
  int32_t tap_layers = 0, tap_dim = 0;
};

// Prompt text handed to the tokenizer: the manifest prompt, rendered with the
// model's chat template (touchstone/harness/chat.h) when case.chat.
std::string case_prompt_text(const ManifestCase& c, const ChatTemplate& chat);

// The grammar oracle of a golden case (nullopt when it has no grammar), at its
// start state; grammar::GrammarError naming the case when it does not compile.
std::optional<grammar::GrammarOracle> golden_case_oracle(const Tokenizer& tok, const GoldenCase& g);

// Greedy decoding of c.n_predict tokens from the prompt (never stops early at
// EOS: every case without a grammar has exactly n_predict steps). A case with
// a grammar records the constrained continuation instead (argmax over the
// oracle's allowed set, which admits a stop token only where the grammar may
// end), stopping after a stop token or where the grammar is complete, and the
// allowed set of every step (docs/structured-output.md); no layer taps and no full logits rows
// (top-K and log-sum-exp only). Step s stores the logits
// that predicted greedy_ids[s]. `progress(step, total)` is called after every step.
// A case with an image (c.has_image(); `image` from prepare_case_image) prefills the
// text before the placeholder, the image's embeddings (prefill_embeddings), then the
// text after it (no BOS); the golden keeps the embeddings and the digests.
GoldenCase record_case(BackendSession& session, const Tokenizer& tok, const ChatTemplate& chat,
                       const ManifestCase& c, const RecordOptions& opt,
                       const std::function<void(int, int)>& progress = {},
                       const CaseImage* image = nullptr);

// The prompt's logits with a golden case's image in it: the text before each frame, that
// frame's embeddings (one prefill_embeddings call, or calls of at most `chunk` rows),
// the text after the last; or the plain prefill. frame_ends: the logits at each frame's
// last row, appended (nullptr: not kept).
std::vector<float> prefill_case_prompt(BackendSession& session, const GoldenCase& g,
                                       int32_t chunk = 0,
                                       std::vector<std::vector<float>>* frame_ends = nullptr);

// Teacher-forced pass over the passage (BOS first when the tokenizer adds one).
GoldenScoring record_scoring(BackendSession& session, const Tokenizer& tok,
                             const ManifestScoring& s, const RecordOptions& opt);

}  // namespace touchstone
