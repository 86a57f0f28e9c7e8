// touchstone/harness/chat.h - chat prompts rendered with the model's own template.
//
// A chat case's prompt is one user turn rendered by the model's
// tokenizer.chat_template with add_generation_prompt=true, as Hugging Face
// transformers' apply_chat_template does (Jinja2 ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, raise_exception, tojson; bos_token,
// eos_token and the other special tokens as variables). No strftime_now is
// defined, so templates that date the system prompt (Llama 3.x) use their own
// fixed fallback date and goldens stay reproducible.
//
// SmolLM2's template (kSmolLM2Template) is rendered in C++ (chatml_prompt); a test
// checks that equals the Jinja2 rendering. Every other template is rendered by
// Jinja2 in a Python subprocess: Debian's /usr/bin/python3 with python3-jinja2
// (ci/packages/core.txt), or $TOUCHSTONE_PYTHON.
#pragma once

#include <string>

namespace touchstone {
namespace gguf {
class File;
}

// Default system prompt SmolLM2's template inserts when the first message is not a system message.
inline constexpr const char* kSmolLM2DefaultSystem =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// SmolLM2-135M-Instruct's tokenizer.chat_template (ChatML with a default system prompt).
inline constexpr const char* kSmolLM2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

struct ChatTemplate {
  std::string source;                // tokenizer.chat_template ("" = the model has none)
  std::string bos_token, eos_token;  // token texts ("" when the model has none)
};

// tokenizer.chat_template and the BOS/EOS token texts of a GGUF file.
ChatTemplate chat_template_from_gguf(const gguf::File& f);

// One user turn with add_generation_prompt=true, as the template renders it.
// Throws touchstone::Error when the model has no template ("chat cases need the
// model's tokenizer.chat_template"), when Python/Jinja2 is missing (naming the
// package to install) or when the template fails (its message).
std::string render_chat(const ChatTemplate& t, const std::string& user);

// Jinja2 rendering regardless of the C++ fast path (tests compare the two).
std::string render_chat_jinja(const ChatTemplate& t, const std::string& user);

// SmolLM2's rendering:
//   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n
std::string chatml_prompt(const std::string& user,
                          const std::string& system = kSmolLM2DefaultSystem);

}  // namespace touchstone
