// log_tail.h - what llama.cpp and libmtmd log, kept instead of printed: the latest
// ~2 KB of messages at or above a level, for the adapter's error messages.
#pragma once

#include <ggml.h>

#include <mutex>
#include <string>

namespace touchstone::llamacpp {

class LogTail {
 public:
  explicit LogTail(ggml_log_level min_level) : min_(min_level) {}
  // A log callback's message; GGML_LOG_LEVEL_CONT continues the previous message's level.
  void add(ggml_log_level level, const char* text);
  // The messages kept since the last call, on one line ("" when none).
  std::string take();

 private:
  std::mutex mu_;
  std::string text_;
  ggml_log_level min_, last_ = GGML_LOG_LEVEL_NONE;
};

}  // namespace touchstone::llamacpp
