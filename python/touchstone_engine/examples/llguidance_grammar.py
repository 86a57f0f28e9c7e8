"""Grammars for the example engines with llguidance: a second grammar engine
beside the harness's oracle (XGrammar), so structured.mask_parity on such an
engine is mask parity between two grammar engines.

llguidance (PyPI `llguidance`, 1.9.1; the Rust library behind Guidance and
vLLM's `guidance` backend; https://github.com/guidance-ai/llguidance) takes
JSON Schema, regex and Lark; GBNF goes through its own converter
(`llguidance.gbnf_to_lark`). Its tokenizer here is the GGUF's vocabulary, with
the token bytes and the text / special split the harness's oracle uses
(parity/grammar/src/vocab.cpp, model/tokenizer/src/tokenizer.cpp):

* byte-level BPE ("gpt2"): each character of a normal token through GPT-2's
  byte alphabet; SentencePiece ("llama"): U+2581 becomes a space, <0xXX> byte
  tokens their byte;
* normal, byte and user-defined tokens take part as text; control, unknown and
  unused ones, and the stop tokens (EOS and, where the vocabulary has it,
  `<end_of_turn>`), are special: llguidance marks them with a leading 0xFF byte
  and never matches them as text. The stop tokens are its EOS set.

Only the example engines import this module, and only when a grammar is set:
`pip install llguidance` where they run (ci/bootstrap puts it in
~/.cache/touchstone/venv-tools, the venv of the structured.numpy_llama tests).
"""

from .. import protocol as P
from ..engine import EngineError
from ..grammar import GrammarState

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def _gpt2_byte_decoder():
    """GPT-2's bytes_to_unicode, inverted: character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(model, tokens, types):
    """The bytes of every token, as model/tokenizer/src/tokenizer.cpp gives them."""
    out = []
    if model == "gpt2":
        dec = _gpt2_byte_decoder()
        for t, ty in zip(tokens, types):
            if ty in (NORMAL, UNUSED, 0):
                out.append(b"".join(bytes([dec[ch]]) if ch in dec else ch.encode("utf-8")
                                    for ch in t))
            else:
                out.append(t.encode("utf-8"))
    elif model == "llama":
        for t, ty in zip(tokens, types):
            if ty == BYTE and t.startswith("<0x") and t.endswith(">"):
                out.append(bytes([int(t[3:-1], 16)]))
            elif ty in (NORMAL, UNUSED, 0):
                out.append(t.replace("\u2581", " ").encode("utf-8"))
            else:
                out.append(t.encode("utf-8"))
    else:
        raise EngineError(P.TS_ERR_UNSUPPORTED, f"llguidance vocabulary: tokenizer model "
                          f"'{model}' (byte-level BPE 'gpt2' and SentencePiece 'llama' only)")
    return out


def _gpt2_pretokens(text):
    """GPT-2's pre-tokenizer regex (llama.cpp kGpt2Regex):
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
    with str.isalpha / isnumeric / isspace for the Unicode classes."""
    def cls(ch):
        return "L" if ch.isalpha() else "N" if ch.isnumeric() else "S" if ch.isspace() else "P"
    out, i, n = [], 0, len(text)
    while i < n:
        for c in ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d"):
            if text.startswith(c, i):
                out.append(c)
                i += len(c)
                break
        else:
            j = i + 1 if text[i] == " " and i + 1 < n and cls(text[i + 1]) != "S" else i
            k = cls(text[j])
            if k != "S":
                e = j + 1
                while e < n and cls(text[e]) == k:
                    e += 1
            else:  # a whitespace run: all of it, but the last one if a non-space follows
                e = i
                while e < n and text[e].isspace():
                    e += 1
                if e < n and e - i > 1:
                    e -= 1
            out.append(text[i:e])
            i = e
    return out


class GGUFVocab:
    """A llguidance.TokenizerWrapper source: token bytes (special ones with a
    leading 0xFF), the EOS token and the model's own tokenizer for plain text
    (llama.cpp's, as model/tokenizer does): byte-level BPE with the "smollm" /
    "gpt2" pre-tokenizers, or SentencePiece's score-driven merges with byte
    fallback. llguidance tokenizes only the fixed strings of a grammar with it,
    but where a grammar forces text it allows only that tokenization of it
    (docs/structured-output.md#llguidance)."""

    def __init__(self, md):
        tokens = md["tokenizer.ggml.tokens"]
        types = md.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
        self.model = md.get("tokenizer.ggml.model", "gpt2")
        raw = token_bytes(self.model, tokens, types)
        eos = int(md["tokenizer.ggml.eos_token_id"])
        self.stops = sorted({eos} | ({tokens.index("<end_of_turn>")}
                                    if "<end_of_turn>" in tokens else set()))
        text = [ty in (NORMAL, BYTE, USER_DEFINED) and i not in self.stops and raw[i] != b""
                for i, ty in enumerate(types)]
        self.tokens = [b if t else b"\xff" + (b or b"<%d>" % i)
                       for i, (b, t) in enumerate(zip(raw, text))]
        self.special_token_ids = [i for i, t in enumerate(text) if not t]
        self.eos_token_id = eos
        bos = md.get("tokenizer.ggml.bos_token_id")
        self.bos_token_id = int(bos) if bos is not None else None
        self._id = {}
        for i, t in enumerate(tokens):
            self._id.setdefault(t, i)
        self._text_of = {i: t for i, t in enumerate(tokens) if types[i] == USER_DEFINED and t}
        self._user_defined = sorted(self._text_of, key=lambda i: -len(tokens[i]))
        if self.model == "gpt2":
            pre = md.get("tokenizer.ggml.pre", "gpt2")
            if pre not in ("gpt2", "smollm"):
                raise EngineError(P.TS_ERR_UNSUPPORTED, f"llguidance vocabulary: pre-tokenizer "
                                  f"'{pre}' (gpt2 and smollm only)")
            self._digits_apart = pre == "smollm"
            self._rank = {m: r for r, m in enumerate(md["tokenizer.ggml.merges"])}
            dec = _gpt2_byte_decoder()
            self._enc = {b: ch for ch, b in dec.items()}
        else:
            self._score = md.get("tokenizer.ggml.scores") or [0.0] * len(tokens)

    def __call__(self, data):
        """Token ids of `data` (UTF-8 bytes): llama.cpp's tokenizer_st_partition
        first (user-defined tokens, longest first, split out wherever they occur),
        then the model's merges on the rest."""
        parts = [bytes(data).decode("utf-8", errors="replace")]
        for t in self._user_defined:
            split = []
            for p in parts:
                if isinstance(p, int):
                    split.append(p)
                    continue
                pieces = p.split(self._text_of[t])
                for k, piece in enumerate(pieces):
                    if k:
                        split.append(t)
                    if piece:
                        split.append(piece)
            parts = split
        out = []
        for p in parts:
            if isinstance(p, int):
                out.append(p)
            else:
                out += self._bpe(p) if self.model == "gpt2" else self._spm(p)
        return out

    def _bpe(self, text):
        pieces = []
        chunks = [text]
        if self._digits_apart:  # HF Digits(individual_digits=true) first
            chunks, cur = [], ""
            for ch in text:
                if ch.isnumeric():
                    chunks += [cur, ch] if cur else [ch]
                    cur = ""
                else:
                    cur += ch
            chunks += [cur] if cur else []
        for c in chunks:
            pieces += _gpt2_pretokens(c)
        out = []
        for p in pieces:
            word = [self._enc[b] for b in p.encode("utf-8")]
            while len(word) > 1:
                ranks = [self._rank.get(f"{a} {b}") for a, b in zip(word, word[1:])]
                best = min((r, i) for i, r in enumerate(ranks) if r is not None) \
                    if any(r is not None for r in ranks) else None
                if best is None:
                    break
                i = best[1]
                word[i:i + 2] = [word[i] + word[i + 1]]
            out += [self._id[w] for w in word]
        return out

    def _spm(self, text):
        """llama.cpp llm_tokenizer_spm: merge the adjacent pair whose text is a
        token with the highest score (leftmost on ties) until none is; a symbol
        that is no token becomes its bytes' <0xNN> tokens."""
        sym = list(text.replace(" ", "\u2581"))
        while len(sym) > 1:
            best, at = None, -1
            for i in range(len(sym) - 1):
                t = self._id.get(sym[i] + sym[i + 1])
                if t is not None and (best is None or self._score[t] > best):
                    best, at = self._score[t], i
            if at < 0:
                break
            sym[at:at + 2] = [sym[at] + sym[at + 1]]
        out = []
        for s_ in sym:
            if s_ in self._id:
                out.append(self._id[s_])
            else:
                out += [self._id["<0x%02X>" % b] for b in s_.encode("utf-8")]
        return out


def lltokenizer(md):
    """The llguidance LLTokenizer of a GGUF's tokenizer metadata (md: key -> value)."""
    import llguidance
    vocab = GGUFVocab(md)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), n_vocab=len(vocab.tokens),
                                  eos_token=vocab.stops)


def compile_grammar(tokenizer, kind, text, stops):
    """A GrammarState for ABI grammar `kind` / `text` (stops: the stop token ids), or
    EngineError TS_ERR_INVALID_ARGUMENT naming what llguidance refused."""
    import llguidance
    form = {P.TS_GRAMMAR_JSON_SCHEMA: "json_schema", P.TS_GRAMMAR_GBNF: "gbnf",
            P.TS_GRAMMAR_REGEX: "regex"}[kind]
    try:
        grammar = llguidance.grammar_from(form, text)
    except (ValueError, RuntimeError) as e:
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"llguidance: {form}: {e}") from None
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                          f"llguidance: {form}: {matcher.get_error()}")
    return LLGuidanceState(matcher, frozenset(stops))


class LLGuidanceState(GrammarState):
    """An llguidance LLMatcher as a GrammarState. A stop token is allowed where
    llguidance's mask allows it (the grammar may end) and is taken here, not by
    the matcher (llguidance does not record an EOS it consumes once stopped, so
    its rollback would undo the token before it); after it nothing is allowed."""

    def __init__(self, matcher, stops, ended=False):
        self.m, self.stops, self.ended = matcher, stops, ended

    def _allows(self, token):
        mask = self.m.compute_bitmask()
        return token // 8 < len(mask) and mask[token // 8] >> (token % 8) & 1

    def accept(self, token):
        if self.ended or self.m.is_error():
            return False
        if token in self.stops:
            self.ended = bool(self._allows(token))
            return self.ended
        # consume_token on a refused token would leave the matcher in its error state
        return self.m.validate_tokens([token]) == 1 and self.m.consume_token(token)

    def rollback(self, n):
        if n and self.ended:
            self.ended, n = False, n - 1
        if n and not self.m.rollback(n):
            raise EngineError(P.TS_ERR_INTERNAL, f"llguidance: rollback({n}): "
                              f"{self.m.get_error()}")

    def mask(self, n_words):
        if self.ended:
            return bytes(4 * n_words)
        return self.m.compute_bitmask()[:4 * n_words]

    def clone(self):
        return LLGuidanceState(self.m.deep_copy(), self.stops, self.ended)
