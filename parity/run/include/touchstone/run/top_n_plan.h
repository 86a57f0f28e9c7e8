// A top-N backend (ABI v5 TS_CAP_TOP_N_LOGPROBS, e.g. http://HOST:PORT, a
// llama-server): which planned checks it cannot support, and the model
// identity check a server allows (its tokenizer against the golden's ids).
#pragma once

#include <string>
#include <vector>

#include "touchstone/golden/golden.h"
#include "touchstone/harness/parity.h"
#include "touchstone/report/report.h"
#include "touchstone/run/backend_host.h"

namespace touchstone {

// N when the backend's rows are top-N log-probabilities, else 0; 0 too when
// the backend cannot say (its checks then fail with the reason).
int backend_top_n(BackendHost& host);

// The scoring passages (every position's full distribution, PPL of the target
// token) and the consistency checks (bitwise / full-row comparisons) as
// NOT SUPPORTED rows, with the reason.
std::vector<NotSupportedCheck> top_n_not_supported(int top_n,
                                                   const std::vector<std::string>& scoring,
                                                   bool consistency);

// "identity.tokenize": the server's /tokenize of the first case's prompt text
// must give the golden's prompt ids (the same vocabulary and tokenizer as the
// manifest's GGUF). A backend without a tokenizer endpoint gives no row.
std::optional<CaseResult> check_remote_tokenizer(BackendHost& host, const GoldenCase& g);

}  // namespace touchstone
