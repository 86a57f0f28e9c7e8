"""Grammars on a Python engine (ABI v7, protocol 5): what serve() does for an
engine whose session class has compile_grammar, as the C++ BackendAdapter does
for Session::compile_grammar (touchstone/abi/backend_adapter.hpp,
docs/contract.md#version-7-structured-output).

An engine writes only

    class MySession(Session):
        def compile_grammar(self, kind, text):
            # kind: protocol.TS_GRAMMAR_JSON_SCHEMA | TS_GRAMMAR_GBNF | TS_GRAMMAR_REGEX
            # raise EngineError(TS_ERR_UNSUPPORTED, ...) for a kind it does not take,
            # EngineError(TS_ERR_INVALID_ARGUMENT, "where") for one that does not compile
            return state   # a GrammarState: the grammar at the current position

and serve() runs every appended token through state.accept before the engine
computes (a refused token fails the call and nothing moves), rolls the state
back on rewind, clones it on fork_session, keeps the last call's logits rows and
answers grammar_mask / grammar_greedy (the masked argmax of each row), with the
standard library only.
"""

import sys
from array import array

from . import protocol as P
from .engine import EngineError


class GrammarState:
    """A grammar's state after the tokens it accepted since it was set."""

    def accept(self, token):
        """Takes `token` and returns True, or returns False and stays unchanged."""
        raise NotImplementedError

    def rollback(self, n):
        """Undoes the last n accepted tokens."""
        raise NotImplementedError

    def mask(self, n_words):
        """The allowed set now: n_words uint32 words (bit i % 32 of word i // 32 =
        token i), as bytes (little-endian) or a NumPy uint32 / int32 array."""
        raise NotImplementedError

    def clone(self):
        """An independent copy in the same state."""
        raise NotImplementedError


def mask_words(n_vocab):
    """TS_MASK_WORDS(n_vocab)."""
    return (n_vocab + 31) // 32


def mask_array(state, n_words):
    """state.mask(n_words) as an array('I') of exactly n_words uint32 words."""
    m = state.mask(n_words)
    if isinstance(m, (bytes, bytearray, memoryview)):
        words = array("I", bytes(m))
    elif hasattr(m, "tobytes"):  # a NumPy array of 32-bit words
        words = array("I", m.astype("<u4").tobytes())
    else:
        words = array("I", [int(w) & 0xFFFFFFFF for w in m])
    if sys.byteorder != "little" and isinstance(m, (bytes, bytearray, memoryview)):
        words.byteswap()
    if len(words) != n_words:
        raise EngineError(P.TS_ERR_INTERNAL, f"grammar mask has {len(words)} words, expected "
                          f"{n_words}")
    return words


def allowed_ids(words, n_vocab):
    """The token ids a mask allows, ascending."""
    out = []
    for w, word in enumerate(words):
        while word:
            low = word & -word
            t = w * 32 + low.bit_length() - 1
            if t < n_vocab:
                out.append(t)
            word ^= low
    return out


def masked_argmax(row, words):
    """abi::masked_argmax: the argmax of `row` (a sequence of floats) over the
    tokens `words` allows (lowest id on ties, NaN never wins); -1 when no allowed
    token has a number."""
    best, best_v = -1, None
    for t in allowed_ids(words, len(row)):
        v = row[t]
        if v != v:  # NaN
            continue
        if best_v is None or v > best_v:
            best, best_v = t, v
    return best


class SessionGrammar:
    """One session's grammar: its state, where it was set and the tokens it
    accepted since."""

    def __init__(self, state, start, tokens=()):
        self.state, self.start, self.tokens = state, start, list(tokens)

    def take(self, tokens, position, fn):
        """Runs `tokens` (appended at `position`) through the grammar; a refused one
        undoes the others and fails the call naming it."""
        for i, t in enumerate(tokens):
            if not self.state.accept(t):
                self.state.rollback(i)
                raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"{fn}: token #{i} = {t} is not "
                                  f"allowed by the grammar at position {position + i}")
        self.tokens.extend(tokens)

    def undo(self, n):
        if n > 0:
            self.state.rollback(n)
            del self.tokens[-n:]

    def rewound(self, position):
        """The grammar after rewind(position); None when that is before its start."""
        if position < self.start:
            return None
        self.undo(self.start + len(self.tokens) - position)
        return self

    def forked(self, n_prefix):
        """A copy in its state at n_prefix; None when that is before its start."""
        if n_prefix < self.start:
            return None
        copy = SessionGrammar(self.state.clone(), self.start, self.tokens)
        copy.undo(self.start + len(self.tokens) - n_prefix)
        return copy


class LastRows:
    """The logits rows of a session's last call: `data` (little-endian float32
    bytes, n_rows x n_vocab), whose last row is at `end` - 1 (the position after
    the call)."""

    def __init__(self, data, n_rows, end):
        self.data, self.n_rows, self.end = data, n_rows, end


def greedy_picks(grammar, rows, n_vocab, n, position):
    """grammar_greedy: the picks of the last n rows of the last call, each over the
    set allowed after its position."""
    if rows is None or rows.end != position:
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT, "grammar_greedy: no logits of the last "
                          "call at this position (a call since, or a rewind)")
    if n < 1 or n > rows.n_rows:
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"grammar_greedy: n_positions {n} outside "
                          f"[1, {rows.n_rows}] (the last call's rows)")
    if position - n + 1 < grammar.start:  # the first judged pick's state precedes the grammar
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT, "grammar_greedy: a position before "
                          "set_grammar's")
    values = array("f", bytes(rows.data))
    if sys.byteorder != "little":
        values.byteswap()
    state = grammar.state.clone()
    state.rollback(n - 1)
    replay = grammar.tokens[len(grammar.tokens) - (n - 1):] if n > 1 else []
    words = mask_words(n_vocab)
    picks = []
    for i in range(n):
        at = (rows.n_rows - n + i) * n_vocab
        picks.append(masked_argmax(values[at:at + n_vocab], mask_array(state, words)))
        if i < len(replay) and not state.accept(replay[i]):
            raise EngineError(P.TS_ERR_INTERNAL, "grammar_greedy: the grammar state refuses a "
                              "token it accepted before")
    return picks
