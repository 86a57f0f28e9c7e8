#include "touchstone/harness/recorder.h"

#include <algorithm>
#include <optional>

#include "touchstone/common/error.h"
#include "touchstone/grammar/oracle.h"
#include "touchstone/harness/chat.h"
#include "touchstone/metrics/metrics.h"
#include "touchstone/vision/image_prompt.h"

namespace touchstone {
namespace {

// Appends the top-K ids/logits and the log-sum-exp of one full logits row.
void append_row_summary(std::span<const float> row, int32_t k, std::vector<int32_t>& ids,
                        std::vector<float>& vals, std::vector<double>& lse) {
  const metrics::TopK t = metrics::top_k(row, k);
  ids.insert(ids.end(), t.ids.begin(), t.ids.end());
  vals.insert(vals.end(), t.values.begin(), t.values.end());
  lse.push_back(metrics::log_sum_exp(row));
}

// The case's grammar oracle (nullopt: no grammar); GrammarError names the case.
std::optional<grammar::GrammarOracle> case_oracle(const Tokenizer& tok, const std::string& name,
                                                  const std::string& kind,
                                                  const std::string& text) {
  if (kind.empty()) return std::nullopt;
  return grammar::GrammarOracle(
      grammar::GrammarVocab(tok),
      grammar::GrammarSpec{grammar::parse_grammar_kind(kind), text, name});
}

// Structured output: the step's allowed set into g.allowed_masks, and the
// argmax over it (the lowest id among equal maxima). Error when nothing is allowed.
int32_t constrained_argmax(const grammar::GrammarOracle& o, std::span<const float> logits,
                           GoldenCase& g, int step) {
  const std::vector<uint32_t> mask = o.allowed_mask();
  g.allowed_masks.insert(g.allowed_masks.end(), mask.begin(), mask.end());
  std::vector<float> masked(logits.begin(), logits.end());
  if (grammar::apply_mask(mask, masked) == 0)
    throw Error("case '{}': step {}: the grammar allows no token", g.name, step);
  return metrics::argmax(masked);
}

}  // namespace

std::optional<grammar::GrammarOracle> golden_case_oracle(const Tokenizer& tok,
                                                         const GoldenCase& g) {
  return case_oracle(tok, g.name, g.grammar_kind, g.grammar_text);
}

std::string case_prompt_text(const ManifestCase& c, const ChatTemplate& chat) {
  if (!c.chat) return c.prompt;
  try {
    return render_chat(chat, c.prompt);
  } catch (const Error& e) {
    throw Error("case '{}': {}", c.name, e.what());
  }
}

std::vector<float> prefill_case_prompt(BackendSession& session, const GoldenCase& g, int32_t chunk,
                                       std::vector<std::vector<float>>* frame_ends) {
  if (!g.has_image()) return session.prefill(g.prompt_ids);
  const std::span<const int32_t> ids(g.prompt_ids);
  const std::span<const float> embd(g.image_embeddings);
  const size_t rows = size_t(g.frame_rows()), dim = size_t(g.image_dim);
  const size_t step = chunk > 0 ? size_t(chunk) : rows;
  size_t done = 0, f = 0;
  for (const int32_t at : g.frame_positions()) {
    if (size_t(at) > done) session.prefill(ids.subspan(done, size_t(at) - done));
    done = size_t(at);
    const std::span<const float> frame = embd.subspan(f++ * rows * dim, rows * dim);
    std::vector<float> last;
    for (size_t r = 0; r < rows; r += step) {
      const size_t m = std::min(step, rows - r);
      last = session.prefill_embeddings(frame.subspan(r * dim, m * dim), g.image_dim,
                                        g.image_bidirectional != 0, false);
    }
    if (frame_ends) frame_ends->push_back(std::move(last));
  }
  return session.prefill(ids.subspan(done));
}

namespace {

// Idefics3: the prompt with the processor's text in place of the placeholder, tokenized
// whole (as HF's processor does), then each run of "<image>" tokens taken out: the
// frame positions.
void place_frames(const Tokenizer& tok, const ManifestCase& c, const CaseImage& image,
                  GoldenCase& g) {
  const auto [before, after] = split_at_image(g.prompt_text, c.name);
  const std::vector<int32_t> token =
      tok.encode(std::string(vision::kIdefics3ImageToken), false, /*parse_special=*/true);
  if (token.size() != 1)
    throw Error(
        "case '{}': {}: the text model's tokenizer has no \"{}\" token, which the "
        "mmproj's processor puts in the prompt: is {} this model's mmproj?",
        c.name, c.model, vision::kIdefics3ImageToken, c.image.mmproj);
  const std::vector<int32_t> all =
      tok.encode(before + image.layout + after, /*add_bos=*/true, /*parse_special=*/true);
  vision::ImageRuns runs;
  try {
    runs = vision::take_image_runs(all, token[0], size_t(image.n_tokens / image.n_frames));
  } catch (const Error& e) {
    throw Error("case '{}': {} (the prompt's own text holds \"{}\"?)", c.name, e.what(),
                vision::kIdefics3ImageToken);
  }
  g.prompt_ids = std::move(runs.text);
  g.image_frames = std::move(runs.at);
  if (g.image_frames.size() != size_t(image.n_frames))
    throw Error("case '{}': {} runs of \"{}\" tokens for an image of {} frames", c.name,
                g.image_frames.size(), vision::kIdefics3ImageToken, image.n_frames);
  if (g.image_frames.front() < 1 || size_t(g.image_frames.back()) >= g.prompt_ids.size())
    throw Error("case '{}': the text before or after the image encodes to zero tokens", c.name);
  g.image_at = g.image_frames.front();
  if (g.image_frames.size() == 1) g.image_frames.clear();
}

// The case's image into the golden: the prompt's ids around it and the embeddings.
void place_image(const Tokenizer& tok, const ManifestCase& c, const CaseImage& image,
                 GoldenCase& g) {
  if (!image.layout.empty()) {
    place_frames(tok, c, image, g);
  } else {
    const auto [before, after] = split_at_image(g.prompt_text, c.name);
    g.prompt_ids = tok.encode(before, /*add_bos=*/true, /*parse_special=*/true);
    const std::vector<int32_t> rest = tok.encode(after, /*add_bos=*/false, /*parse_special=*/true);
    if (g.prompt_ids.empty() || rest.empty())
      throw Error("case '{}': the text before or after the image encodes to zero tokens", c.name);
    g.image_at = int32_t(g.prompt_ids.size());
    g.prompt_ids.insert(g.prompt_ids.end(), rest.begin(), rest.end());
  }
  g.image_tokens = image.n_tokens;
  g.image_dim = image.dim;
  g.image_bidirectional = image.bidirectional ? 1 : 0;
  g.image_embeddings = image.embeddings;
  g.image_sha256 = image.image_sha256;
  g.pixels_sha256 = image.pixels_sha256;
  g.mmproj_sha256 = image.mmproj_sha256;
}

}  // namespace

GoldenCase record_case(BackendSession& session, const Tokenizer& tok, const ChatTemplate& chat,
                       const ManifestCase& c, const RecordOptions& opt,
                       const std::function<void(int, int)>& progress, const CaseImage* image) {
  GoldenCase g;
  g.name = c.name;
  g.chat = c.chat;
  g.prompt_text = case_prompt_text(c, chat);
  if (c.has_image() != (image != nullptr))
    throw Error("case '{}': {}", c.name,
                image ? "an image given for a case without one" : "its image was not prepared");
  if (image)
    place_image(tok, c, *image, g);
  else
    g.prompt_ids = tok.encode(g.prompt_text, /*add_bos=*/true, /*parse_special=*/true);
  if (g.prompt_ids.empty()) throw Error("case '{}': the prompt encodes to zero tokens", c.name);
  g.n_vocab = session.n_vocab();
  g.top_k = std::min(opt.case_top_k, g.n_vocab);
  // A grammar case stores no full rows: its subject is the constrained tokens
  // and the allowed sets; its logits are compared by their top-K and
  // log-sum-exp (a Gemma 3 row is 1 MB, goldens/ has a 40 MiB budget).
  g.n_full_steps = c.has_grammar() ? 0 : std::min(opt.n_full_steps, c.n_predict);

  // Structured output: the continuation is the constrained one, which may stop
  // before n_predict (a stop token, or the grammar complete); no layer taps.
  std::optional<grammar::GrammarOracle> oracle =
      case_oracle(tok, c.name, c.grammar.kind, c.grammar.text);
  g.grammar_kind = c.grammar.kind;
  g.grammar_text = c.grammar.text;
  const bool taps = !oracle && session.has_taps() && opt.tap_layers > 0 && opt.tap_dim > 0;
  if (taps) {
    for (int32_t s : opt.tap_steps)
      if (s >= 0 && s < c.n_predict) g.tap_steps.push_back(s);
    g.tap_layers = opt.tap_layers;
    g.tap_dim = opt.tap_dim;
    session.set_taps(!g.tap_steps.empty());
  }
  session.rewind(0);
  std::vector<float> logits = prefill_case_prompt(session, g);
  for (int s = 0; s < c.n_predict; ++s) {
    if (oracle && oracle->is_completed()) break;
    if (taps && std::find(g.tap_steps.begin(), g.tap_steps.end(), s) != g.tap_steps.end()) {
      const std::vector<float> t = session.read_taps(g.tap_record_size());
      g.taps.insert(g.taps.end(), t.begin(), t.end());
    }
    if (!metrics::all_finite(logits)) {
      throw Error("case '{}': step {}: the recording backend produced non-finite logits", c.name,
                  s);
    }
    if (s < g.n_full_steps) g.full_logits.insert(g.full_logits.end(), logits.begin(), logits.end());
    append_row_summary(logits, g.top_k, g.topk_ids, g.topk_logits, g.lse);
    const int32_t next =
        oracle ? constrained_argmax(*oracle, logits, g, s) : metrics::argmax(logits);
    g.greedy_ids.push_back(next);
    if (progress) progress(s + 1, c.n_predict);
    if (oracle && oracle->vocab().is_stop(next)) break;  // EOS only where the grammar may end
    if (oracle && !oracle->accept(next))
      throw Error("case '{}': step {}: the grammar refused its own allowed token {}", c.name, s,
                  next);
    if (s + 1 < c.n_predict) session.decode(next, logits);
  }
  g.greedy_text = tok.decode(g.greedy_ids);
  if (taps) session.set_taps(false);
  return g;
}

GoldenScoring record_scoring(BackendSession& session, const Tokenizer& tok,
                             const ManifestScoring& s, const RecordOptions& opt) {
  GoldenScoring g;
  g.name = s.name;
  g.text = s.text;
  // As the model is run: BOS first when its tokenizer adds one (Gemma; not SmolLM2).
  g.token_ids = tok.encode(s.text, /*add_bos=*/true, /*parse_special=*/false);
  if (g.token_ids.size() < 2) throw Error("scoring '{}': passage has fewer than 2 tokens", s.name);
  g.n_vocab = session.n_vocab();
  g.top_k = std::min(s.top_k > 0 ? s.top_k : opt.scoring_top_k, g.n_vocab);
  session.rewind(0);
  const size_t R = g.token_ids.size() - 1;  // the last position predicts nothing
  session.prefill_all_rows(g.token_ids, [&](size_t i, std::span<const float> row) {
    if (i >= R) return;
    append_row_summary(row, g.top_k, g.topk_ids, g.topk_logits, g.lse);
    g.target_logits.push_back(row[size_t(g.token_ids[i + 1])]);
  });
  return g;
}

}  // namespace touchstone
