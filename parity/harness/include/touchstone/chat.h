// touchstone/chat.h - the ChatML prompt template (SmolLM2's tokenizer.chat_template).
#pragma once

#include <string>

namespace touchstone {

// Default system prompt SmolLM2's template inserts when the first message is not a system message.
inline constexpr const char* kSmolLM2DefaultSystem =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// True when a GGUF tokenizer.chat_template is ChatML (uses <|im_start|> / <|im_end|>).
bool is_chatml_template(const std::string& chat_template);

// One user turn with add_generation_prompt=true, exactly as the Jinja template renders it:
//   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n
std::string chatml_prompt(const std::string& user,
                          const std::string& system = kSmolLM2DefaultSystem);

}  // namespace touchstone
