// touchstone run --model M --prompt "..." -n 64 [--chat] [--backend NAME|PATH]
// Prints the greedy continuation token by token as it is generated.
#include <fmt/format.h>

#include <cstdio>

#include "backend_host.h"
#include "cli_common.h"
#include "touchstone/chat.h"
#include "touchstone/error.h"
#include "touchstone/gguf.h"
#include "touchstone/metrics.h"

namespace touchstone::cli {

void add_run(CLI::App& app, int& exit_code) {
  struct Opts {
    std::string model, prompt, backend = "reference", weights = "full_precision";
    int n_predict = 64, threads = 0;
    bool chat = false, stop_at_eos = true, in_process = false;
    double timeout = 300.0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd =
      app.add_subcommand("run", "Greedy generation: prints the continuation as it is generated");
  cmd->add_option("--model,-m", o->model, "GGUF model file")->required();
  cmd->add_option("--prompt,-p", o->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")
      ->check(CLI::Range(1, 1 << 20).description("an integer in [1, 1048576]"));
  cmd->add_flag("--chat", o->chat, "Wrap the prompt in the model's ChatML template");
  cmd->add_option("--backend,-b", o->backend, "Backend name or library path");
  cmd->add_option("--weights", o->weights, "full_precision | quantized");
  cmd->add_option("--threads,-t", o->threads, "Threads (0 = all cores)")
      ->check(CLI::Range(0, 4096).description("an integer in [0, 4096]"));
  cmd->add_option("--timeout", o->timeout, "Time limit per backend call in seconds")
      ->check(CLI::Range(0.001, 1e6).description("seconds in (0, 1e6]"));
  cmd->add_flag("--in-process", o->in_process,
                "Load the backend into this process instead of a child process");
  cmd->add_flag("!--no-stop", o->stop_at_eos, "Do not stop at the end-of-turn token");
  cmd->callback([o, &exit_code] {
    Tokenizer tok = load_tokenizer(o->model);
    std::string text = o->prompt;
    if (o->chat) {
      const gguf::File f = gguf::File::open(o->model);
      const auto tmpl = f.find_string("tokenizer.chat_template");
      if (!tmpl || !is_chatml_template(*tmpl)) {
        throw Error("{}: --chat needs a ChatML tokenizer.chat_template", o->model);
      }
      text = chatml_prompt(o->prompt);
    }
    const std::vector<int32_t> ids = tok.encode(text, true, true);
    if (ids.empty()) throw Error("the prompt encodes to zero tokens");
    // The backend's n_vocab must be the model's vocabulary size: the logits
    // buffers are sized by it.
    BackendHost host(HostOptions{o->backend, o->in_process, o->timeout, o->model,
                                 SessionOptions{parse_weight_path(o->weights), o->threads, 0, ""},
                                 tok.n_vocab()});
    Session& session = host.session();
    fmt::print(stderr, "[{} on {}; {} prompt tokens]\n", host.library().name(),
               host.library().device_name(), ids.size());
    if (!o->chat) fmt::print("{}", o->prompt);
    std::fflush(stdout);
    std::vector<float> logits = session.prefill(ids);
    const auto end_turn = tok.find_token("<|im_end|>");
    for (int i = 0; i < o->n_predict; ++i) {
      const int32_t next = metrics::argmax(logits);
      if (o->stop_at_eos && (next == tok.eos() || (end_turn && next == *end_turn))) break;
      fmt::print("{}", tok.token_bytes(next));
      std::fflush(stdout);
      if (i + 1 < o->n_predict) session.decode(next, logits);
    }
    fmt::print("\n");
    exit_code = 0;
  });
}

}  // namespace touchstone::cli
