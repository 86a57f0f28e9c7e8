#include "touchstone/golden/json_depth.h"

#include "touchstone/common/error.h"

namespace touchstone {

void check_json_depth(std::string_view text, const std::string& file) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw Error("{}: JSON nested deeper than {} levels at byte {}", file, kMaxJsonDepth, i);
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace touchstone
