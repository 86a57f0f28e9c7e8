// chat.cpp - see touchstone/harness/chat.h.
#include "touchstone/harness/chat.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"

namespace touchstone {
namespace {

// transformers' _compile_jinja_template + apply_chat_template, reading a JSON request
// on stdin and writing the rendered text to stdout.
constexpr const char* kRenderScript = R"py(
import json, sys
try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    sys.stderr.write("python3-jinja2 is not installed (%s): apt-get install python3-jinja2" % e)
    sys.exit(3)
req = json.load(sys.stdin)
def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
try:
    out = env.from_string(req["template"]).render(
        messages=req["messages"], add_generation_prompt=True,
        bos_token=req["bos_token"], eos_token=req["eos_token"])
except Exception as e:
    sys.stderr.write("%s: %s" % (type(e).__name__, e))
    sys.exit(4)
sys.stdout.write(out)
)py";

// The interpreters to try, in order: TOUCHSTONE_PYTHON alone when set, else
// the python3 on PATH (an active virtual environment's) and then
// /usr/bin/python3 (Debian's python3-jinja2), each once.
std::vector<std::string> pythons_for_jinja() {
  if (const char* p = std::getenv("TOUCHSTONE_PYTHON"); p && *p) return {p};
  std::vector<std::string> out;
  const char* env = std::getenv("PATH");
  const std::string path = env ? env : "";
  for (size_t start = 0; start <= path.size();) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string cand = (end > start ? path.substr(start, end - start) : ".") + "/python3";
    if (::access(cand.c_str(), X_OK) == 0) {
      out.push_back(cand);
      break;
    }
    start = end + 1;
  }
  std::error_code ec;
  const bool same = !out.empty() && std::filesystem::equivalent(out[0], "/usr/bin/python3", ec);
  if (!same && ::access("/usr/bin/python3", X_OK) == 0) out.push_back("/usr/bin/python3");
  if (out.empty()) out.push_back("python3");  // execlp's error names it
  return out;
}

std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0)
      out.append(buf, size_t(n));
    else if (n == 0 || errno != EINTR)
      break;
  }
  return out;
}

struct PythonRun {
  int status = 0;  // waitpid status
  std::string out, err;
  bool ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  // 127: could not run; 3: no jinja2 (kRenderScript): worth trying another interpreter.
  bool interpreter_unusable() const {
    return WIFEXITED(status) && (WEXITSTATUS(status) == 127 || WEXITSTATUS(status) == 3);
  }
};

// Writes all of `data` to `fd` with SIGPIPE blocked in this thread, so an
// interpreter that exits before reading its stdin (one without Jinja2, say)
// is an EPIPE here, not the death of the whole process. A SIGPIPE raised
// meanwhile is consumed before the old mask comes back (the pattern
// POSIX's sigtimedwait() exists for); the library never touches the
// process-wide disposition.
void write_ignoring_sigpipe(int fd, const std::string& data) {
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t pending;
  sigemptyset(&pending);
  ::sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // EPIPE: the child's exit status says why
    done += size_t(n);
  }
  if (!was_pending) {
    const timespec zero{};
    while (::sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
}

// Runs `py -I -c script` with `input` on stdin. posix_spawnp, not fork: the caller may
// hold a model of many GB (an 8B model's 4.9 GB of blocks while recording goldens), and
// fork would have to reserve a copy of it (ENOMEM) only for the child to exec at once.
PythonRun run_python(const std::string& py, const std::string& input) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC))
    throw Error("chat template: pipe: {}", std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::string a0 = py, a1 = "-I", a2 = "-c", a3 = kRenderScript;
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, py.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {  // not found or not runnable: "cannot run", as an exec failure in a child
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) ::close(fd);
    PythonRun r;
    r.status = 127 << 8;  // exited with 127
    r.err = std::strerror(rc);
    return r;
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  // The script reads all of stdin before writing, and the request is small.
  write_ignoring_sigpipe(in[1], input);
  ::close(in[1]);
  PythonRun r;
  r.out = read_all(out[0]);
  r.err = read_all(err[0]);
  ::close(out[0]);
  ::close(err[0]);
  while (::waitpid(pid, &r.status, 0) < 0 && errno == EINTR) {
  }
  return r;
}

// The rendered text from the first interpreter that has Jinja2; a template
// error is thrown at once; no usable interpreter: an error naming each one tried.
std::string render_with_python(const std::string& input) {
  std::vector<std::string> tried;
  for (const std::string& py : pythons_for_jinja()) {
    const PythonRun r = run_python(py, input);
    if (r.ok()) return r.out;
    if (!r.interpreter_unusable()) {
      throw Error("chat template: rendering with Jinja2 ({}) failed: {}", py,
                  r.err.empty() ? "wait status " + std::to_string(r.status) : r.err);
    }
    tried.push_back(py + ": " + (WEXITSTATUS(r.status) == 127 ? "cannot run" : r.err));
  }
  throw Error(
      "chat template: no Python with Jinja2 (tried {}); apt-get install python3-jinja2, "
      "pip install jinja2, or set TOUCHSTONE_PYTHON",
      fmt::join(tried, "; "));
}

}  // namespace

ChatTemplate chat_template_from_gguf(const gguf::File& f) {
  ChatTemplate t;
  t.source = f.find_string("tokenizer.chat_template").value_or("");
  if (f.has("tokenizer.ggml.tokens")) {
    const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    auto text = [&](const char* key) {
      const auto id = f.find_uint(key);
      return id && *id < tokens.size() ? tokens[*id] : std::string();
    };
    t.bos_token = text("tokenizer.ggml.bos_token_id");
    t.eos_token = text("tokenizer.ggml.eos_token_id");
  }
  return t;
}

std::string render_chat_jinja(const ChatTemplate& t, const std::string& user) {
  const nlohmann::json req = {{"template", t.source},
                              {"messages", {{{"role", "user"}, {"content", user}}}},
                              {"bos_token", t.bos_token},
                              {"eos_token", t.eos_token}};
  return render_with_python(req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::string render_chat(const ChatTemplate& t, const std::string& user) {
  if (t.source.empty()) {
    throw Error("chat cases need the model's tokenizer.chat_template, and this model has none");
  }
  if (t.source == kSmolLM2Template) return chatml_prompt(user);
  return render_chat_jinja(t, user);
}

std::string chatml_prompt(const std::string& user, const std::string& system) {
  return "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n" + user +
         "<|im_end|>\n<|im_start|>assistant\n";
}

}  // namespace touchstone
