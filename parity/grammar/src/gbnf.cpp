// gbnf.cpp - llama.cpp's GBNF dialect to XGrammar's EBNF (internal.h).
#include <string>
#include <string_view>

#include "touchstone/grammar/oracle.h"

namespace touchstone::grammar {

// GBNF allows an empty alternative ("ws ::= | \" \"", "( | x )"); XGrammar's
// parser needs an element in every sequence ("Expect element, but got |"). An
// empty alternative is the empty string, so "" is written where one starts
// (after ::=, | or an opening parenthesis) and is followed at once by | or ).
// String literals, character classes and # comments are copied unchanged.
std::string gbnf_to_xgrammar(std::string_view in) {
  std::string out;
  out.reserve(in.size() + 16);
  bool alt_start = false;  // only blanks since ::=, | or (
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '"' || c == '[') {  // a literal or a class, with backslash escapes
      const char close = c == '"' ? '"' : ']';
      size_t j = i + 1;
      while (j < in.size() && in[j] != close) j += in[j] == '\\' ? 2 : 1;
      out.append(in.substr(i, j + 1 - i));
      i = j;
      alt_start = false;
      continue;
    }
    if (c == '#') {  // a comment, to the end of the line
      size_t j = in.find('\n', i);
      if (j == std::string_view::npos) j = in.size();
      out.append(in.substr(i, j - i));
      i = j - 1;
      continue;
    }
    if (in.substr(i, 3) == "::=") {
      out += "::=";
      i += 2;
      alt_start = true;
      continue;
    }
    if ((c == '|' || c == ')') && alt_start) out += "\"\" ";
    out += c;
    if (c == '|' || c == '(') {
      alt_start = true;
    } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      alt_start = false;
    }
  }
  return out;
}

}  // namespace touchstone::grammar
