// touchstone tokenize --model M.gguf (--prompt TEXT | --jsonl FILE|-): token ids of
// texts with the model's own tokenizer (model/tokenizer), without running the
// model. --jsonl reads one JSON string per line and prints one JSON array of ids
// per line, in order (what ci/check_tokenizer.py compares with HF tokenizers).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_common.h"
#include "touchstone/common/error.h"
#include "touchstone/model/tokenizer.h"

namespace touchstone::cli {

void add_tokenize(CLI::App& app, int& exit_code) {
  struct Opts {
    std::string model, prompt, jsonl;
    bool no_bos = false, no_parse_special = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Token ids of texts with the model's tokenizer");
  cmd->add_option("--model,-m", o->model, "GGUF model file")->required();
  auto* p = cmd->add_option("--prompt,-p", o->prompt, "One text");
  auto* j = cmd->add_option("--jsonl", o->jsonl,
                            "File of JSON strings, one per line ('-' = stdin); prints one JSON "
                            "array of ids per line");
  p->excludes(j);
  cmd->add_flag("--no-bos", o->no_bos, "Do not add BOS/EOS (HF add_special_tokens=False)");
  cmd->add_flag("--no-parse-special", o->no_parse_special,
                "Tokenize control-token text as plain text");
  cmd->callback([o, &exit_code] {
    const Tokenizer tok = load_tokenizer(o->model);
    auto ids_of = [&](const std::string& text) {
      return nlohmann::json(tok.encode(text, !o->no_bos, !o->no_parse_special)).dump();
    };
    if (o->jsonl.empty()) {
      fmt::print("{}\n", ids_of(o->prompt));
      exit_code = 0;
      return;
    }
    std::ifstream file;
    if (o->jsonl != "-") {
      file.open(o->jsonl, std::ios::binary);
      if (!file) throw Error("{}: cannot read", o->jsonl);
    }
    std::istream& in = o->jsonl == "-" ? std::cin : file;
    std::string line;
    for (size_t n = 1; std::getline(in, line); ++n) {
      const nlohmann::json v = nlohmann::json::parse(line, nullptr, false);
      if (!v.is_string()) throw Error("{}: line {}: expected one JSON string", o->jsonl, n);
      fmt::print("{}\n", ids_of(v.get<std::string>()));
    }
    exit_code = 0;
  });
}

}  // namespace touchstone::cli
