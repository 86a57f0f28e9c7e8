// touchstone run --model M --prompt "..." -n 64 [--chat] [--backend NAME|PATH]
// Prints the greedy continuation token by token as it is generated, or with
// --json one JSON object: prompt ids, generated ids, their bytes and the top-K
// logits of every step (what the reference computes for a new prompt, without
// writing a manifest or reading HDF5).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "touchstone/common/error.h"
#include "touchstone/harness/chat.h"
#include "touchstone/metrics/metrics.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/tokenizer.h"
#include "touchstone/run/backend_host.h"

namespace touchstone::cli {
namespace {

// The model's end-of-turn token: tokenizer.ggml.eot_token_id, else the first of the
// usual end-of-turn texts the vocabulary has (as llama.cpp's llama_vocab::load).
std::optional<int32_t> end_of_turn_token(const std::string& model, const Tokenizer& tok) {
  const gguf::File f = gguf::File::open_metadata(model);
  if (auto id = f.find_uint("tokenizer.ggml.eot_token_id"); id && *id < uint64_t(tok.n_vocab()))
    return int32_t(*id);
  for (const char* t :
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>"}) {
    if (auto id = tok.find_token(t)) return *id;
  }
  return std::nullopt;
}

// Top-k (id, logit) of one logits row, descending by logit, ties -> lower id.
nlohmann::ordered_json top_k_json(const std::vector<float>& logits, int k, const Tokenizer& tok) {
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  const size_t n = std::min(ids.size(), size_t(k));
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(n), ids.end(),
                    [&](int32_t a, int32_t b) {
                      return logits[size_t(a)] > logits[size_t(b)] ||
                             (logits[size_t(a)] == logits[size_t(b)] && a < b);
                    });
  auto out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < n; ++i) {
    out.push_back({{"id", ids[i]},
                   {"logit", logits[size_t(ids[i])]},
                   {"text", sanitize_utf8(tok.token_bytes(ids[i]))}});
  }
  return out;
}

std::string hex_bytes(const std::string& b) {
  std::string h;
  for (unsigned char c : b) h += fmt::format("{:02x}", c);
  return h;
}

struct RunOpts {
  std::string model, prompt, backend = "reference", weights = "full_precision";
  int n_predict = 64, threads = 0;
  bool chat = false, stop_at_eos = true, in_process = false, json = false;
  int top_k = 10;
  double timeout = 300.0;
};

// Greedy generation with the options: the continuation as text, or one JSON object.
void generate(const RunOpts& o) {
  Tokenizer tok = load_tokenizer(o.model);
  std::string text = o.prompt;
  const ChatTemplate chat = chat_template_from_gguf(gguf::File::open_metadata(o.model));
  if (o.chat) text = render_chat(chat, o.prompt);  // the model's own template
  const std::vector<int32_t> ids = tok.encode(text, true, true);
  if (ids.empty()) throw Error("the prompt encodes to zero tokens");
  // The backend's n_vocab must be the model's vocabulary size: the logits
  // buffers are sized by it.
  BackendHost host(HostOptions{
      o.backend, o.in_process, o.timeout, o.model,
      BackendSessionOptions{parse_weight_path(o.weights), o.threads, 0, ""}, tok.n_vocab(), ""});
  BackendSession& session = host.session();
  fmt::print(stderr, "[{} on {}; {} prompt tokens]\n", host.library().name(),
             host.library().device_name(), ids.size());
  if (!o.chat && !o.json) fmt::print("{}", o.prompt);
  std::fflush(stdout);
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  std::vector<int32_t> generated;
  std::string out_bytes;
  std::vector<float> logits = session.prefill(ids);
  const auto end_turn = end_of_turn_token(o.model, tok);
  for (int i = 0; i < o.n_predict; ++i) {
    const int32_t next = metrics::argmax(logits);
    const bool stop = o.stop_at_eos && (next == tok.eos() || (end_turn && next == *end_turn));
    const std::string piece = tok.token_bytes(next);
    if (o.json) {
      steps.push_back({{"step", i},
                       {"token", next},
                       {"text", sanitize_utf8(piece)},
                       {"bytes_hex", hex_bytes(piece)},
                       {"top_k", top_k_json(logits, o.top_k, tok)}});
    }
    if (stop) break;
    generated.push_back(next);
    out_bytes += piece;
    if (!o.json) fmt::print("{}", piece);
    std::fflush(stdout);
    if (i + 1 < o.n_predict) session.decode(next, logits);
  }
  if (o.json) {
    nlohmann::ordered_json j = {{"model", o.model},
                                {"backend", host.library().name()},
                                {"device", sanitize_utf8(host.library().device_name())},
                                {"weights", o.weights},
                                {"prompt_text", sanitize_utf8(text)},
                                {"prompt_ids", ids},
                                {"generated_ids", generated},
                                {"generated_text", sanitize_utf8(out_bytes)},
                                {"generated_bytes_hex", hex_bytes(out_bytes)},
                                {"steps", steps}};
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("\n");
  }
}

}  // namespace

void add_run(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunOpts>();
  CLI::App* cmd =
      app.add_subcommand("run", "Greedy generation: prints the continuation as it is generated");
  cmd->add_option("--model,-m", o->model, "GGUF model file")->required();
  cmd->add_option("--prompt,-p", o->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")
      ->check(CLI::Range(1, 1 << 20).description("an integer in [1, 1048576]"));
  cmd->add_flag("--chat", o->chat,
                "Render the prompt as one user turn with the model's tokenizer.chat_template; "
                "stop at the model's end-of-turn token");
  cmd->add_option("--backend,-b", o->backend, "Backend name or library path");
  cmd->add_option("--weights", o->weights, "full_precision | quantized");
  cmd->add_option("--threads,-t", o->threads, "Threads (0 = all cores)")
      ->check(CLI::Range(0, 4096).description("an integer in [0, 4096]"));
  cmd->add_option("--timeout", o->timeout, "Time limit per backend call in seconds")
      ->check(finite_seconds());
  cmd->add_flag("--in-process", o->in_process,
                "Load the backend into this process instead of a child process");
  cmd->add_flag("!--no-stop", o->stop_at_eos, "Do not stop at the end-of-turn token");
  cmd->add_flag("--json", o->json,
                "Print one JSON object (prompt ids, generated ids and bytes, top-K logits per "
                "step) instead of the text");
  cmd->add_option("--top-k", o->top_k, "With --json: logits listed per step")
      ->check(CLI::Range(1, 1000).description("an integer in [1, 1000]"));
  cmd->callback([o, &exit_code] {
    generate(*o);
    exit_code = 0;
  });
}

}  // namespace touchstone::cli
