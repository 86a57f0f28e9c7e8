// Chat prompts come from the model's own template: the C++ fast path for SmolLM2
// equals Jinja2's rendering of its real template, other templates go through
// Jinja2 with HF's environment, and a missing or failing template is an error
// that says why.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "touchstone/common/error.h"
#include "touchstone/harness/chat.h"

namespace touchstone {
namespace {

bool jinja_available() {
  try {
    render_chat_jinja(ChatTemplate{"ok", "", ""}, "x");
    return true;
  } catch (const Error&) {
    return false;
  }
}

TEST(Chat, SmolLM2FastPathEqualsJinja2) {
  if (!jinja_available())
    GTEST_SKIP() << "python3-jinja2 missing (ci/packages/core.txt installs it)";
  const ChatTemplate t{kSmolLM2Template, "<|im_start|>", "<|im_end|>"};
  for (const char* user : {"Hi!", "Explain why the sky is blue.", "emoji 🎉 and Zoë", ""}) {
    EXPECT_EQ(render_chat(t, user), render_chat_jinja(t, user)) << user;
  }
  EXPECT_EQ(render_chat(t, "Hi!"), chatml_prompt("Hi!"));
}

TEST(Chat, OtherTemplatesRenderWithJinja2LikeHF) {
  if (!jinja_available())
    GTEST_SKIP() << "python3-jinja2 missing (ci/packages/core.txt installs it)";
  // Gemma's template shape: bos_token, role mapping, trim filter, generation prompt.
  const ChatTemplate gemma{
      "{{ bos_token }}{% for message in messages %}"
      "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
      "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}",
      "<bos>", "<eos>"};
  EXPECT_EQ(render_chat(gemma, "  Hi  "),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  // trim_blocks / lstrip_blocks as in transformers' environment.
  // (without them: "\n  [a]\n").
  const ChatTemplate blocks{
      "{% for m in messages %}\n  {% if true %}[{{ m['content'] }}]{% endif %}\n{% endfor %}", "",
      ""};
  EXPECT_EQ(render_chat(blocks, "a"), "[a]");
}

TEST(Chat, MissingOrFailingTemplateIsAnErrorThatSaysWhy) {
  try {
    render_chat(ChatTemplate{}, "Hi");
    ADD_FAILURE() << "no error for a model without a template";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat_template"), std::string::npos) << e.what();
  }
  if (!jinja_available()) GTEST_SKIP() << "python3-jinja2 missing";
  try {
    render_chat(ChatTemplate{"{{ raise_exception('only system roles here') }}", "", ""}, "Hi");
    ADD_FAILURE() << "no error for a raising template";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only system roles here"), std::string::npos) << e.what();
  }
}

// Sets an environment variable for one scope, restoring the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A python3 first on PATH: `body` is its shell script.
std::string fake_python(const std::string& dir_name, const std::string& body) {
  const auto dir = std::filesystem::temp_directory_path() / dir_name;
  std::filesystem::create_directories(dir);
  const auto exe = dir / "python3";
  std::ofstream(exe) << "#!/bin/sh\n" << body << "\n";
  ::chmod(exe.c_str(), 0755);
  return dir.string();
}

// The python3 on PATH (an active environment) comes before /usr/bin/python3,
// one without Jinja2 is skipped, and when none works the error names each.
TEST(Chat, JinjaInterpreterIsThePathsPythonThenTheSystemOne) {
  if (!jinja_available()) GTEST_SKIP() << "python3-jinja2 missing";
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  const auto marker = std::filesystem::temp_directory_path() / "ts_chat_path_python_used";
  std::filesystem::remove(marker);
  {
    const std::string dir = fake_python(
        "ts_chat_path_python", "touch " + marker.string() + "; exec /usr/bin/python3 \"$@\"");
    ScopedEnv p("PATH", dir + ":" + path);
    EXPECT_EQ(render_chat_jinja(ChatTemplate{"ok", "", ""}, "x"), "ok");
    EXPECT_TRUE(std::filesystem::exists(marker)) << "the python3 on PATH was not tried first";
  }
  {
    const std::string dir = fake_python(
        "ts_chat_no_jinja", "echo 'python3-jinja2 is not installed (fake)' >&2; exit 3");
    ScopedEnv p("PATH", dir + ":" + path);
    // A request larger than a pipe's buffer (64 KiB on Linux): the write is
    // still under way when the fake exits unread, so the harness must take
    // the EPIPE (not die of SIGPIPE) and go on to /usr/bin/python3.
    const std::string big = "{# " + std::string(256 * 1024, 'x') + " #}ok";
    EXPECT_EQ(render_chat_jinja(ChatTemplate{big, "", ""}, "x"), "ok");
  }
  {
    ScopedEnv py("TOUCHSTONE_PYTHON", "/nonexistent/python3");
    try {
      render_chat_jinja(ChatTemplate{"ok", "", ""}, "x");
      ADD_FAILURE() << "no error for a missing interpreter";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("/nonexistent/python3: cannot run"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace touchstone
