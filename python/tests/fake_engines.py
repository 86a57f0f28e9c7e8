"""Small engines for the tests: standard library only, deterministic logits.

FakeEngine's logits at position p for token t are [t + p + i / 1000 for i in
range(n_vocab)]: enough to check what reaches the harness, nothing to compute.
"""

from array import array

from touchstone_engine import (TS_CAP_ALL_POSITION_LOGITS, TS_ERR_IO, TS_ERR_UNSUPPORTED,
                               Capabilities, Engine, EngineError, Session)

N_VOCAB = 8


class FakeModel:
    def __init__(self, path, n_vocab=N_VOCAB):
        self.path = path
        self.n_vocab = n_vocab


def row(token, pos, n_vocab=N_VOCAB):
    return [float(token + pos) + i / 1000.0 for i in range(n_vocab)]


class FakeSession(Session):
    def __init__(self, model, options):
        self.model, self.options = model, options
        self.pos = 0
        self.max_ctx = options.max_context or 32
        self.taps_on = False
        self.recorded = None
        self.closed = False

    def position(self):
        return self.pos

    def max_context(self):
        return self.max_ctx

    def prefill(self, tokens, all_positions):
        rows = []
        for t in tokens:
            rows.append(row(t, self.pos, self.model.n_vocab))
            self.pos += 1
        if self.taps_on:
            self.recorded = array("f", [float(self.pos)] * 6)  # 2 layers x 3 points x 1
        if self.model.path.endswith("list"):
            return rows if all_positions else rows[-1]  # a nested list
        flat = array("f", [x for r in (rows if all_positions else rows[-1:]) for x in r])
        return flat

    def rewind(self, position):
        self.pos = position

    def close(self):
        self.closed = True


class EmbeddingSession(FakeSession):
    """ABI v8 input embeddings of width 2: row i of the result is the row FakeSession
    gives for a token equal to the sum of the embedding's two values (+ 100 when the
    block is bidirectional)."""

    def n_embd(self):
        return 2

    def prefill_embeddings(self, embeddings, n_embd, bidirectional, all_positions):
        v = array("f")
        v.frombytes(embeddings)
        tokens = [int(v[i] + v[i + 1]) + (100 if bidirectional else 0)
                  for i in range(0, len(v), n_embd)]
        return self.prefill(tokens, all_positions)


class GreedyTapsSession(FakeSession):
    def prefill_greedy(self, tokens):
        logits = self.prefill(tokens, False)
        return max(range(len(logits)), key=lambda i: logits[i])

    def set_taps(self, on):
        self.taps_on = on
        self.recorded = None

    def read_taps(self):
        return self.recorded


class FakeEngine(Engine):
    name = "fake"
    version = "1.2.3"
    architectures = "llama"
    model_features = ""
    faults = ("known_fault",)
    session_class = FakeSession

    def device_name(self):
        return "fake device"

    def capabilities(self):
        return Capabilities(flags=TS_CAP_ALL_POSITION_LOGITS, max_context=32,
                            shape_buckets=[4], determinism_note="none")

    def load_model(self, path):
        if path.endswith("missing"):
            raise EngineError(TS_ERR_IO, f"{path}: no such file")
        if path.endswith("qwen"):
            raise EngineError(TS_ERR_UNSUPPORTED, "architecture 'qwen2' is not supported")
        if path.endswith("boom"):
            raise ValueError("deliberate failure in load_model")
        if path.endswith("oom"):
            raise MemoryError()
        if path.endswith("zero_vocab"):
            return FakeModel(path, 0)
        return FakeModel(path)

    def open_session(self, model, options):
        return self.session_class(model, options)


class EmbeddingEngine(FakeEngine):
    session_class = EmbeddingSession


class GreedyTapsEngine(FakeEngine):
    name = "fake_greedy"
    session_class = GreedyTapsSession


class WrongSizeSession(FakeSession):
    def prefill(self, tokens, all_positions):
        self.pos += len(tokens)
        return array("f", [0.0] * 3)


class WrongSizeEngine(FakeEngine):
    session_class = WrongSizeSession


class NoAdvanceSession(FakeSession):
    def prefill(self, tokens, all_positions):
        return array("f", [0.0] * self.model.n_vocab * (len(tokens) if all_positions else 1))


class NoAdvanceEngine(FakeEngine):
    session_class = NoAdvanceSession


class HalfTapsSession(FakeSession):
    def set_taps(self, on):
        pass


class HalfTapsEngine(FakeEngine):
    session_class = HalfTapsSession


class FailingEngine(FakeEngine):
    def __init__(self):
        raise RuntimeError("cannot find the accelerator")


class ChattyEngine(FakeEngine):
    """Prints to stdout from inside serve(): must end up on stderr."""

    def device_name(self):
        import os
        print("chatty engine: print()")
        os.write(1, b"chatty engine: os.write(1)\n")
        return "chatty device"


class FdEngine(FakeEngine):
    """Its device name lists the child's open file descriptors."""

    def device_name(self):
        import os
        fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
        return "fds " + ",".join(str(f) for f in fds)


class ServingSession(FakeSession):
    def fork_copy(self, n_prefix):
        s = ServingSession(self.model, self.options)
        s.pos = n_prefix
        return s


class ServingEngine(FakeEngine):
    """ABI v6: step_batch (a loop over prefill) and fork. fail_batch makes
    step_batch raise after advancing every session; short_entry makes entry 1's
    logits one float short."""

    name = "fake_serving"
    session_class = ServingSession
    fail_batch = short_entry = False

    def capabilities(self):
        c = super().capabilities()
        c.max_batch = 3
        return c

    def step_batch(self, entries):
        out = [e.session.prefill(e.tokens, e.all_positions) for e in entries]
        if self.fail_batch:
            raise RuntimeError("device lost mid-batch")
        if self.short_entry:
            out[1] = out[1][:-1]
        return out

    def fork(self, session, n_prefix):
        return session.fork_copy(n_prefix)


class ClaimsServingEngine(FakeEngine):
    """Claims both ABI v6 flags without the methods: serve() clears them."""

    def capabilities(self):
        from touchstone_engine import TS_CAP_BATCHED_SESSIONS, TS_CAP_KV_PREFIX_COPY
        c = super().capabilities()
        c.flags |= TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY
        return c


class CountingGrammar:
    """A toy grammar (ABI v7): up to three of the tokens 2..5, then only the stop
    token 1 (allowed after the first); nothing after the stop."""

    STOP = 1

    def __init__(self, taken=()):
        self.taken = list(taken)

    def allowed(self):
        if self.taken and self.taken[-1] == self.STOP:
            return set()
        k = len(self.taken)
        return ({2, 3, 4, 5} if k < 3 else set()) | ({self.STOP} if k >= 1 else set())

    def accept(self, token):
        if token not in self.allowed():
            return False
        self.taken.append(token)
        return True

    def rollback(self, n):
        del self.taken[len(self.taken) - n:]

    def mask(self, n_words):
        words = [0] * n_words
        for t in self.allowed():
            words[t // 32] |= 1 << (t % 32)
        return words

    def clone(self):
        return CountingGrammar(self.taken)


class GrammarSession(ServingSession):
    def compile_grammar(self, kind, text):
        from touchstone_engine import protocol as P
        if kind == P.TS_GRAMMAR_REGEX:
            raise EngineError(P.TS_ERR_UNSUPPORTED, "fake: no regex")
        if text != "count":
            raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"fake: grammar {text!r} at byte 0")
        return CountingGrammar()

    def fork_copy(self, n_prefix):
        s = GrammarSession(self.model, self.options)
        s.pos = n_prefix
        return s


class GrammarEngine(ServingEngine):
    """ABI v7: a session class with compile_grammar (CountingGrammar)."""

    name = "fake_grammar"
    session_class = GrammarSession
