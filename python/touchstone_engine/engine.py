"""What an engine implements: Engine (the backend), its models and Sessions.

The calls and their meaning are the session contract of
common/include/touchstone/abi/backend_abi.h (docs/contract.md); serve() checks
every request the way the C++ adapter (touchstone/abi/backend_adapter.hpp) does
before an engine sees it, so an engine computes and nothing else:

    class MySession(Session):
        def position(self): ...                 # tokens in the KV cache
        def max_context(self): ...              # tokens it can hold
        def prefill(self, tokens, all_positions):
            ...  # append tokens (ids already checked); return float32 logits:
                 # n_vocab values, or len(tokens) * n_vocab (any shape) when all_positions
        def rewind(self, position): ...         # 0 <= position <= position(), checked
        # optional: decode(token) -> n_vocab logits       (default: prefill([token], False))
        # optional: prefill_greedy(tokens) -> int         (sets TS_CAP_DEVICE_GREEDY)
        # optional: set_taps(on); read_taps() -> floats or None   (ABI v4 layer taps)
        # optional (ABI v8, both or neither; sets TS_CAP_EMBEDDING_INPUT): n_embd() -> int and
        #   prefill_embeddings(embeddings, n_embd, bidirectional, all_positions) -> logits
        #   (embeddings: bytes, n x n_embd little-endian float32 rows used in place of token
        #   embeddings; bidirectional: the rows also attend to each other's later rows;
        #   sizes, room and "no grammar set" checked)
        # optional: close()                                (free_session)

    class MyEngine(Engine):
        name, version = "mine", "0.1.0"
        architectures, model_features = "llama", ""     # optional (ABI v3)
        session_class = MySession
        def load_model(self, path): ...        # an object with n_vocab (int or method)
        def open_session(self, model, options): return MySession(...)
        # optional (ABI v6; hello reports each only when overridden):
        def step_batch(self, entries): ...     # [BatchEntry] -> [logits of each entry]
        def fork(self, session, n_prefix): ... # a new Session holding session's first n_prefix

    serve(MyEngine)

Logits may be a NumPy array (any float dtype; converted to little-endian
float32), an array.array('f'), any buffer of format 'f', or a (nested) list of
numbers. Raise EngineError(TS_ERR_UNSUPPORTED, "why") for a weight type, model
or option the engine does not compute, TS_ERR_IO for a file it cannot read,
TS_ERR_DEVICE when there is no usable device; any other exception becomes
TS_ERR_INTERNAL with the exception's last traceback line (the full traceback
goes to stderr), MemoryError TS_ERR_OUT_OF_MEMORY.
"""

import platform
from dataclasses import dataclass

from . import protocol
from .protocol import Capabilities


class EngineError(Exception):
    """An error with the ts_status it maps to (protocol.TS_ERR_*)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message

    def __str__(self):
        return self.message


@dataclass
class SessionOptions:
    """ts_session_options, already range-checked by serve()."""

    weight_path: int = protocol.TS_WEIGHTS_FULL_PRECISION  # TS_WEIGHTS_*
    n_threads: int = 0  # 0 = engine default
    max_context: int = 0  # 0 = the model's context length
    fault: str = ""  # test-only fault name ("" = none); only names in Engine.faults arrive

    @property
    def full_precision(self):
        return self.weight_path == protocol.TS_WEIGHTS_FULL_PRECISION


class Session:
    """One sequence; owns its KV cache. Subclass it (see the module docstring)."""

    def position(self):
        raise NotImplementedError

    def max_context(self):
        raise NotImplementedError

    def prefill(self, tokens, all_positions):
        raise NotImplementedError

    def decode(self, token):
        return self.prefill([token], False)

    def rewind(self, position):
        raise NotImplementedError

    def close(self):
        pass


@dataclass
class BatchEntry:
    """One sequence's share of Engine.step_batch (ts_batch_entry), already checked
    by serve(): sessions distinct and of one model and weight path, token ids in
    [0, n_vocab), room in the KV cache, all_positions only with
    TS_CAP_ALL_POSITION_LOGITS."""

    session: Session
    tokens: list
    all_positions: bool = False


class Engine:
    """The backend. Subclass it; serve() takes the class (or an instance)."""

    name = "python"  # ts_backend.name
    version = "0.0.0"
    architectures = None  # e.g. "llama": GGUF architectures it loads (None = not declared)
    model_features = None  # e.g. "" (none beyond a plain Llama), "*" (all)
    faults = ()  # fault names open_session accepts; any other is refused (TS_ERR_UNSUPPORTED)
    session_class = Session  # inspected at hello for prefill_greedy / set_taps + read_taps

    def device_name(self):
        return f"CPU: {platform.processor() or platform.machine()} (Python {platform.python_version()})"

    def capabilities(self):
        return Capabilities()

    def load_model(self, path):
        raise NotImplementedError

    def free_model(self, model):
        pass

    def open_session(self, model, options):
        raise NotImplementedError

    # ---- ABI v6 [serving]: optional; the hello reports each one only when a
    # subclass overrides it, and the harness then calls it. ----

    def step_batch(self, entries):
        """Advances every entry's session as session.prefill(tokens, all_positions)
        would, and returns the logits of each entry in entry order (n_vocab values,
        or len(tokens) * n_vocab with all_positions). Set TS_CAP_BATCHED_SESSIONS in
        capabilities() only when this is one forward pass over every entry's tokens.
        If it raises, serve() rewinds every session to where it was."""
        raise EngineError(protocol.TS_ERR_UNSUPPORTED, f"engine '{self.name}' has no step_batch")

    def fork(self, session, n_prefix):
        """A new session with session's options whose KV cache holds its first
        n_prefix positions (0 <= n_prefix <= position(), checked); session is left
        unchanged and the two are independent. Taps start off. serve() sets
        TS_CAP_KV_PREFIX_COPY when this is overridden."""
        raise EngineError(protocol.TS_ERR_UNSUPPORTED, f"engine '{self.name}' has no fork")
