// log_tail.cpp - see log_tail.h.
#include "log_tail.h"

#include <algorithm>

namespace touchstone::llamacpp {

void LogTail::add(ggml_log_level level, const char* text) {
  std::lock_guard<std::mutex> lock(mu_);
  if (level != GGML_LOG_LEVEL_CONT) last_ = level;
  if (last_ < min_ || last_ == GGML_LOG_LEVEL_CONT || !text) return;
  text_ += text;
  if (text_.size() > 2048) text_.erase(0, text_.size() - 2048);
}

std::string LogTail::take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s;
  s.swap(text_);
  std::replace(s.begin(), s.end(), '\n', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace touchstone::llamacpp
