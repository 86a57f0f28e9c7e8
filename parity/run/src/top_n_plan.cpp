#include "touchstone/run/top_n_plan.h"

#include <fmt/format.h>

#include <chrono>

namespace touchstone {

int backend_top_n(BackendHost& host) {
  try {
    const ts_capabilities c = host.library().capabilities();
    return (c.flags & TS_CAP_TOP_N_LOGPROBS) && c.top_n > 0 ? c.top_n : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

std::vector<NotSupportedCheck> top_n_not_supported(int top_n,
                                                   const std::vector<std::string>& scoring,
                                                   bool consistency) {
  std::vector<NotSupportedCheck> out;
  for (const std::string& n : scoring) {
    out.push_back({n, fmt::format("a scoring passage needs every position's probability of the "
                                  "target token and full rows (PPL, RMS delta-p, top-K NMSE); the "
                                  "backend returns only its top-{} log-probabilities",
                                  top_n)});
  }
  if (consistency) {
    out.push_back({"consistency", fmt::format("the consistency checks compare full logits rows "
                                              "(prefill vs decode, chunked, rewind, threads); "
                                              "the backend returns only top-{} log-probabilities",
                                              top_n)});
  }
  return out;
}

std::optional<CaseResult> check_remote_tokenizer(BackendHost& host, const GoldenCase& g) {
  const auto t0 = std::chrono::steady_clock::now();
  CaseResult r;
  r.name = "identity.tokenize";
  try {
    const std::optional<std::vector<int32_t>> ids =
        host.library().channel().tokenize(g.prompt_text);
    if (!ids) return std::nullopt;
    r.n_total = r.n_steps = 1;
    if (*ids == g.prompt_ids) {
      r.n_matched = 1;
    } else {
      size_t i = 0;
      while (i < ids->size() && i < g.prompt_ids.size() && (*ids)[i] == g.prompt_ids[i]) ++i;
      r.failures.push_back(fmt::format(
          "the server tokenizes case '{}' into {} ids, the golden has {}; first difference at "
          "index {} (server {}, golden {}): it is not serving the manifest's model/tokenizer",
          g.name, ids->size(), g.prompt_ids.size(), i,
          i < ids->size() ? fmt::format("{}", (*ids)[i]) : "end",
          i < g.prompt_ids.size() ? fmt::format("{}", g.prompt_ids[i]) : "end"));
    }
  } catch (const std::exception& e) {
    r.backend_error = fmt::format("tokenize: {}", e.what());
    r.failures.push_back(r.backend_error);
  }
  r.passed = r.failures.empty();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace touchstone
