#include "touchstone/report/report.h"

#include "touchstone/harness/known_divergence.h"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>

#include "report_text.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/model/tokenizer.h"

namespace touchstone {
namespace {

using report_detail::printable;

// Every string the table prints that a backend, a manifest or a file supplied.
std::string t(const std::string& s) { return terminal_text(s); }

// The first step whose logits break the profile and, separately, the first greedy
// flip: "logits@0; flip@7: 12'a'→9'b'".
std::string divergence_cell(const CaseResult& c) {
  if (!c.backend_error.empty()) return "backend failed (see why)";
  std::string cell;
  if (c.first_logit_violation_step >= 0)
    cell = fmt::format("logits@{}", c.first_logit_violation_step);
  if (c.first_divergence) {
    const GreedyDivergence& d = *c.first_divergence;
    cell += fmt::format("{}flip@{}: {}{}→{}{}{}", cell.empty() ? "" : "; ", d.step, d.ref_id,
                        printable(d.ref_text), d.test_id, printable(d.test_text),
                        d.accepted ? " (near-tie)" : "");
  }
  if (!c.passed && c.first_layer_divergence) {
    const LayerDivergence& l = *c.first_layer_divergence;
    cell += fmt::format("{}L{} {}@{}", cell.empty() ? "" : "; ", l.layer,
                        l.point == 0 ? "attn" : (l.point == 1 ? "ffn" : "resid"), l.step);
  }
  return cell.empty() ? "-" : cell;
}

template <typename Result>
const char* row_verdict(const Result& r) {
  return r.passed ? "PASS" : r.known_divergence ? "KNOWN" : "FAIL";
}

// Known divergences: which entry, this run's numbers against the reviewed ones.
std::string known_divergence_lines(const Report& r) {
  std::string o;
  auto add = [&](const std::string& name, const std::optional<KnownDivergenceMatch>& k) {
    if (!k) return;
    if (o.empty()) o += "\nknown divergences (reviewed; not counted as failures):\n";
    o += fmt::format("  {} / {}: '{}' ({}; measured on {}, reviewed by {})\n", t(r.info.backend),
                     t(name), t(k->id), t(k->source), t(k->measured_on), t(k->reviewed_by));
    for (const auto& c : k->checks) {
      o += fmt::format("      {} {:.3e} (measured {:.3e}, accepted {} {:.3e})\n", c.check, c.value,
                       c.measured, KnownDivergences::lower_bound(c.check) ? ">=" : "<=", c.accept);
    }
    o += fmt::format("      why: {}\n", t(k->why));
  };
  for (const CaseResult& c : r.cases) add(c.name, c.known_divergence);
  for (const ScoringResult& s : r.scoring) add(s.name, s.known_divergence);
  return o;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  const std::string u = sanitize_utf8(s);  // valid UTF-8 from here on
  std::string o;
  for (size_t i = 0; i < u.size();) {
    const auto c = static_cast<unsigned char>(u[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c == '&') {
      o += "&amp;";
    } else if (c == '<') {
      o += "&lt;";
    } else if (c == '>') {
      o += "&gt;";
    } else if (c == '"') {
      o += "&quot;";
    } else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      o += fmt::format("\\x{:02X}", c);
    } else if (u.compare(i, 3, "\xEF\xBF\xBE") == 0 || u.compare(i, 3, "\xEF\xBF\xBF") == 0) {
      o += u[i + 2] == '\xBE' ? "\\u{FFFE}" : "\\u{FFFF}";
    } else {
      o.append(u, i, n);
    }
    i += n;
  }
  return o;
}

std::string terminal_text(const std::string& s) {
  const std::string u = sanitize_utf8(s);  // valid UTF-8 from here on
  std::string o;
  for (size_t i = 0; i < u.size(); ++i) {
    const auto c = static_cast<unsigned char>(u[i]);
    const auto next = i + 1 < u.size() ? static_cast<unsigned char>(u[i + 1]) : 0u;
    if (c == '\n') {
      o += "\\n";
    } else if (c == '\r') {
      o += "\\r";
    } else if (c == '\t') {
      o += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      o += fmt::format("\\x{:02x}", c);
    } else if (c == 0xC2 && next >= 0x80 && next <= 0x9F) {  // C1: U+0080..U+009F
      o += fmt::format("\\u{{{:x}}}", next);
      ++i;
    } else {
      o += char(c);
    }
  }
  return o;
}

std::string Report::verdict() const {
  const auto failed = [](const auto& row) { return !row.acceptable(); };
  if (std::ranges::any_of(cases, failed) || std::ranges::any_of(scoring, failed)) return "FAIL";
  if (!skipped.empty()) return "SKIP";
  if (!unsupported.empty()) return "UNSUPPORTED";
  if (!complete) return "INCOMPLETE";
  if (!passed()) return "FAIL";
  return n_known_divergences() > 0 ? "KNOWN_DIVERGENCE" : "PASS";
}

bool Report::passed() const {
  if (!complete || (cases.empty() && scoring.empty())) return false;
  for (const auto& c : cases)
    if (!c.acceptable()) return false;
  for (const auto& s : scoring)
    if (!s.acceptable()) return false;
  return true;
}

int Report::n_known_divergences() const {
  int n = 0;
  for (const auto& c : cases) n += c.known_divergence ? 1 : 0;
  for (const auto& s : scoring) n += s.known_divergence ? 1 : 0;
  return n;
}

namespace {

// NMSE / max-abs of a case: "n/s" (not supported) for a top-N backend.
std::string metric_cell(const CaseResult& c, double v) {
  return c.logprobs_top_n > 0 ? std::string("n/s") : fmt::format("{:.2e}", v);
}

// What the run could not check (a top-N backend): the NOT SUPPORTED checks
// with their reasons, and per case the profile checks left out.
std::string not_supported_text(const Report& r) {
  std::string o;
  for (const NotSupportedCheck& n : r.not_supported)
    o += fmt::format("  {} / {}: NOT SUPPORTED: {}\n", t(r.info.backend), t(n.check), t(n.reason));
  for (const CaseResult& c : r.cases) {
    if (c.not_supported.empty()) continue;
    std::string names;
    for (const std::string& n : c.not_supported) names += (names.empty() ? "" : ", ") + n;
    o += fmt::format(
        "  {} / {}: top-{} log-probabilities: NOT SUPPORTED: {}; KL is a lower bound "
        "(docs/metrics.md#top-n-backends), up to {} reference top-K tokens missing from a row\n",
        t(r.info.backend), t(c.name), c.logprobs_top_n, t(names), c.topn_missing_max);
  }
  return o.empty() ? o : "\nnot supported by this backend:\n" + o;
}

}  // namespace

std::string format_table(const Report& r) {
  std::string o;
  const RunInfo& i = r.info;
  const std::string backend = t(i.backend);
  o += fmt::format(
      "backend {} ({}), device: {}\nmodel {} sha256 {}\nweights {}, profile '{}', suite '{}', "
      "threads {}, {}\n\n",
      t(i.backend), t(i.backend_path), t(i.device), t(i.model_name), t(i.model_sha256),
      t(i.weight_path), t(i.profile), t(i.suite), i.n_threads,
      i.execution.empty() ? "in process" : t(i.execution));
  o += fmt::format("{:<12} {:<27} {:<7} {:>9} {:>10} {:>10} {:>10}  {}\n", "backend", "case",
                   "verdict", "matched", "NMSE max", "max|Δ|", "KLD mean", "first divergence");
  for (const CaseResult& c : r.cases) {
    o += fmt::format("{:<12} {:<27} {:<7} {:>4}/{:<4} {:>10} {:>10} {:>10.2e}  {}\n", backend,
                     t(c.name), row_verdict(c), c.n_matched, c.n_total, metric_cell(c, c.nmse_max),
                     metric_cell(c, c.max_abs), c.kld_mean, divergence_cell(c));
  }
  for (const NotSupportedCheck& n : r.not_supported) {
    o += fmt::format("{:<12} {:<27} {}\n", backend, t(n.check), "NOT SUPPORTED");
  }
  for (const ScoringResult& s : r.scoring) {
    const auto& st = s.stats;
    o += fmt::format(
        "{:<12} {:<27} {:<7} {:>9} {:>10.2e} {:>10.2e} {:>10.2e}  KLD p99 {:.2e} max {:.2e}, "
        "top-1 {:.4f}, RMS Δp {:.2e}, PPL {:.4f}/{:.4f} (ratio {:.5f}), max ref tail {:.1e}\n",
        backend, t(s.name), row_verdict(s), fmt::format("{} pos", st.n_positions), s.topk_nmse,
        s.topk_max_abs, st.kld.mean, st.kld.p99, st.kld.max, st.top1_agreement, st.rms_delta_p,
        st.ppl_test, st.ppl_ref, st.ppl_ratio, st.max_p_tail);
  }
  bool any = false;
  for (const CaseResult& c : r.cases) {
    if (c.known_divergence) continue;
    for (const std::string& f : c.failures) {
      if (!any) o += "\nwhy:\n";
      any = true;
      o += fmt::format("  {} / {}: {}\n", backend, t(c.name), t(f));
    }
    for (const GreedyDivergence& d : c.near_ties) {
      o += fmt::format("  {} / {}: near-tie accepted at step {} (margin {:.4f}): {}{} vs {}{}\n",
                       backend, t(c.name), d.step, d.ref_margin, d.ref_id, printable(d.ref_text),
                       d.test_id, printable(d.test_text));
    }
  }
  for (const ScoringResult& s : r.scoring) {
    if (s.known_divergence) continue;
    for (const std::string& f : s.failures) {
      if (!any) o += "\nwhy:\n";
      any = true;
      o += fmt::format("  {} / {}: {}\n", backend, t(s.name), t(f));
    }
  }
  o += known_divergence_lines(r);
  o += not_supported_text(r);
  int greedy_steps = 0;
  for (const CaseResult& c : r.cases) greedy_steps += c.device_greedy_steps;
  if (greedy_steps > 0) {
    o += fmt::format(
        "\ndevice greedy (TS_CAP_DEVICE_GREEDY): {} steps re-run through prefill_greedy, each "
        "token checked against the argmax of the backend's own logits\n",
        greedy_steps);
  }
  const size_t done = r.cases.size() + r.scoring.size();
  const std::string verdict = r.verdict();
  if (verdict == "SKIP" || verdict == "UNSUPPORTED") {
    o += fmt::format("\nverdict: {}: {}\n", verdict, t(r.skipped + r.unsupported));
  } else if (verdict == "INCOMPLETE") {
    o += fmt::format("\nverdict: INCOMPLETE ({} of {} checks finished)\n", done, r.n_planned);
  } else {
    o += fmt::format("\nverdict: {}\n", verdict);
  }
  return sanitize_utf8(o);
}

std::string to_junit(const Report& r) {
  size_t n = r.cases.size() + r.scoring.size(), failures = 0, skipped = 0;
  for (const auto& c : r.cases) failures += c.acceptable() ? 0 : 1;
  for (const auto& s : r.scoring) failures += s.acceptable() ? 0 : 1;
  for (const auto& c : r.cases) skipped += c.known_divergence ? 1 : 0;
  for (const auto& s : r.scoring) skipped += s.known_divergence ? 1 : 0;
  const std::string suite = xml_escape("parity." + r.info.backend + "." + r.info.weight_path);
  std::string o = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += fmt::format(
      "<testsuites><testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\">\n", suite,
      n + r.not_supported.size(), failures, skipped + r.not_supported.size());
  if (!r.complete) {
    o += fmt::format(
        "  <system-err>{}</system-err>\n",
        xml_escape(fmt::format("incomplete run: {} of {} checks finished", n, r.n_planned)));
  }
  // A known divergence is <skipped> (JUnit has no "expected failure"), its message
  // naming the entry, the failure lines in the body.
  auto tc = [&](const std::string& name, double secs, const std::vector<std::string>& fails,
                const std::optional<KnownDivergenceMatch>& known) {
    o += fmt::format("  <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\"", suite,
                     xml_escape(name), secs);
    if (known) {
      std::string msg;
      for (const auto& f : fails) msg += f + "\n";
      o += fmt::format(">\n    <skipped message=\"{}\">{}</skipped>\n  </testcase>\n",
                       xml_escape(fmt::format("known divergence '{}': {}", known->id, known->why)),
                       xml_escape(msg));
      return;
    }
    if (fails.empty()) {
      o += "/>\n";
      return;
    }
    std::string msg;
    for (const auto& f : fails) msg += f + "\n";
    o += fmt::format(">\n    <failure message=\"{}\">{}</failure>\n  </testcase>\n",
                     xml_escape(fails.front()), xml_escape(msg));
  };
  for (const auto& c : r.cases) tc(c.name, c.seconds, c.failures, c.known_divergence);
  for (const auto& s : r.scoring) tc(s.name, s.seconds, s.failures, s.known_divergence);
  for (const NotSupportedCheck& ns : r.not_supported) {
    o += fmt::format(
        "  <testcase classname=\"{}\" name=\"{}\" time=\"0.000\">\n    <skipped "
        "message=\"{}\"/>\n  </testcase>\n",
        suite, xml_escape(ns.check), xml_escape("NOT SUPPORTED: " + ns.reason));
  }
  o += "</testsuite></testsuites>\n";
  return o;
}

std::string utc_timestamp(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int first_failing_step(const CaseResult& c) {
  const int a = c.first_logit_violation_step, b = c.first_unaccepted_flip_step;
  if (a < 0) return b;
  return b < 0 ? a : std::min(a, b);
}

void write_file_atomic(const std::string& path, const std::string& content) {
  fileio::write_atomic(path, content);
}

}  // namespace touchstone
