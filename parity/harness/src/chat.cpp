#include "touchstone/chat.h"

namespace touchstone {

bool is_chatml_template(const std::string& t) {
  return t.find("<|im_start|>") != std::string::npos && t.find("<|im_end|>") != std::string::npos;
}

std::string chatml_prompt(const std::string& user, const std::string& system) {
  return "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n" + user +
         "<|im_end|>\n<|im_start|>assistant\n";
}

}  // namespace touchstone
