// chat.cpp - see touchstone/chat.h.
#include "touchstone/chat.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "touchstone/error.h"
#include "touchstone/gguf.h"

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

std::string python_for_jinja() {
  if (const char* p = std::getenv("TOUCHSTONE_PYTHON"); p && *p) return p;
  return ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
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

// Runs `python -I -c script` with `input` on stdin; returns stdout, throws with stderr.
std::string run_python(const std::string& input) {
  const std::string py = python_for_jinja();
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC))
    throw Error("chat template: pipe: {}", std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("chat template: fork: {}", std::strerror(errno));
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execlp(py.c_str(), py.c_str(), "-I", "-c", kRenderScript, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  // The script reads all of stdin before writing, and the request is small.
  for (size_t done = 0; done < input.size();) {
    const ssize_t n = ::write(in[1], input.data() + done, input.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    done += size_t(n);
  }
  ::close(in[1]);
  const std::string text = read_all(out[0]), msg = read_all(err[0]);
  ::close(out[0]);
  ::close(err[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return text;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    throw Error("chat template: cannot run {} (set TOUCHSTONE_PYTHON)", py);
  throw Error("chat template: rendering with Jinja2 ({}) failed: {}", py,
              msg.empty() ? "exit status " + std::to_string(status) : msg);
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
  return run_python(req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
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
