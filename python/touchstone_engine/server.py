"""serve(engine): the child side of the protocol, for an engine written in Python.

The harness starts the program with `touchstone ... --backend "exec:CMD ARGS"`;
the socket is fd 3. serve() answers requests until the harness closes it, then
exits 0, like tools/backend_runner/runner.cpp does for a library. It never
writes to stdout (fd 1 and sys.stdout go to stderr: the harness prints its
report there), and it checks every request before the engine sees it: handles,
token ids in [0, n_vocab), room in the KV cache, rewind range, weight path,
sizes of what the engine returns.
"""

import operator
import os
import signal
import socket
import stat
import struct
import sys
import traceback
from array import array

from . import grammar as G
from . import protocol as P
from .engine import BatchEntry, Engine, EngineError, SessionOptions


def _index(v, what):
    try:
        return operator.index(v)
    except TypeError:
        raise EngineError(P.TS_ERR_INTERNAL, f"{what} returned {type(v).__name__} {v!r}, "
                          "expected an int") from None


def _flatten(seq):
    for x in seq:
        if isinstance(x, (list, tuple)):
            yield from _flatten(x)
        else:
            yield x


def f32_bytes(values, expected, what):
    """Little-endian float32 bytes of `expected` values: a NumPy-like array (any
    float dtype, any shape), a buffer of format 'f', or a (nested) sequence."""
    if hasattr(values, "dtype") and hasattr(values, "astype"):  # NumPy, without importing it
        a = values.astype("<f4", copy=False)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")
        data = memoryview(a).cast("B")  # no copy: logits of a long prefill are ~0.5 GB
    else:
        try:
            mv = memoryview(values)
        except TypeError:
            mv = None
        if mv is not None:
            if mv.format not in ("f", "<f", "=f") or mv.itemsize != 4:
                raise EngineError(P.TS_ERR_INTERNAL, f"{what} returned a buffer of format "
                                  f"{mv.format!r}, expected float32 ('f')")
            data = mv.tobytes()
        else:
            try:
                data = array("f", _flatten(values)).tobytes()
            except TypeError as e:
                raise EngineError(P.TS_ERR_INTERNAL, f"{what} returned "
                                  f"{type(values).__name__}, expected float32 values: {e}") from None
        if sys.byteorder != "little":
            a = array("f", data)
            a.byteswap()
            data = a.tobytes()
    if len(data) != 4 * expected:  # len() of a 'B' view or bytes: the byte count
        raise EngineError(P.TS_ERR_INTERNAL, f"{what} returned {len(data) // 4} floats, expected "
                          f"{expected} (n_vocab x positions)")
    return data


def _last_line(exc):
    """The traceback's last line ("ValueError: ...") and where it was raised."""
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    tb = traceback.extract_tb(exc.__traceback__)
    if tb:
        f = tb[-1]
        line += f" ({os.path.basename(f.filename)}:{f.lineno} in {f.name})"
    return line


def _has(cls, name):
    return cls is not None and callable(getattr(cls, name, None))


def _overrides(engine, name):
    """True when the engine's class replaces Engine's default `name`."""
    mine = getattr(type(engine), name, None)
    return callable(mine) and mine is not getattr(Engine, name, None)


class Server:
    """The request loop over one connected socket (tests drive it directly)."""

    def __init__(self, engine, sock, command_line=""):
        self._engine_spec = engine
        self.engine = None
        self.sock = sock
        self.command_line = command_line
        self.models = {}  # handle -> [model, n_vocab]
        self.sessions = {}  # handle -> [session, n_vocab, model handle, weight path]
        self.grammars = {}  # session handle -> grammar.SessionGrammar (ABI v7)
        self.rows = {}  # session handle -> grammar.LastRows of its last call
        self._next = 1
        self.greedy = self.taps = False
        self.has_step_batch = self.has_fork = False  # ABI v6, protocol >= 4
        self.version = P.VERSION  # agreed in the hello

    # ---- transport ----
    def _read_exact(self, n):
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:], n - got)
            except InterruptedError:
                continue
            except OSError:
                return None
            if k == 0:
                return None
            got += k
        return bytes(buf)

    def _send(self, *parts):
        try:
            for part in parts:
                self.sock.sendall(part)
        except OSError:
            os._exit(3)  # the harness is gone

    def _reply(self, op, payload):
        """A reply frame; `payload` is bytes or a list of bytes-like parts (sent as
        they are: a large logits buffer is never copied into one frame)."""
        parts = payload if isinstance(payload, list) else [payload]
        header = struct.pack("<IIQ", P.MAGIC, op | P.REPLY_BIT, sum(len(p) for p in parts))
        self._send(header, *parts)

    def _read_frame(self, max_payload):
        header = self._read_exact(P.HEADER_SIZE)
        if header is None:
            return None
        op, n = P.parse_header(header, max_payload)
        body = self._read_exact(n) if n else b""
        return None if body is None else (op, body)

    # ---- hello ----
    def hello(self):
        """Answers the first frame with the engine's identity; False when the
        engine could not start (the error was sent) or the harness left."""
        got = self._read_frame(64)
        if got is None:
            return False
        body = got[1]
        # The harness's version: an older one gets its own back, with its fields.
        self.version = P.negotiate(struct.unpack("<I", body[:4])[0] if len(body) >= 4 else 0)
        reply_op = P.HELLO | P.REPLY_BIT
        try:
            info = self._start_engine()
        except Exception as e:  # the engine's constructor, class checks
            traceback.print_exc(file=sys.stderr)
            msg = str(e) if isinstance(e, EngineError) else _last_line(e)
            self._send(P.frame(reply_op, P.error_payload(P.TS_ERR_INTERNAL,
                                                         f"engine cannot start: {msg}")))
            return False
        w = P.Writer().i32(P.TS_OK)
        info.encode(w)
        self._send(P.frame(reply_op, w.bytes()))
        return True

    def _start_engine(self):
        spec = self._engine_spec
        is_factory = isinstance(spec, type) or (callable(spec) and not isinstance(spec, Engine)
                                                and not hasattr(spec, "load_model"))
        engine = spec() if is_factory else spec
        cls = getattr(engine, "session_class", None)
        self.greedy = _has(cls, "prefill_greedy")
        has_set, has_read = _has(cls, "set_taps"), _has(cls, "read_taps")
        if has_set != has_read:
            raise EngineError(P.TS_ERR_INTERNAL, f"engine '{engine.name}': its session class "
                              "defines only one of set_taps and read_taps (both or neither)")
        self.taps = has_set
        try:
            claims = (engine.capabilities().flags & P.TS_CAP_DEVICE_GREEDY) != 0
        except Exception:  # no device now: its calls fail later with their own status
            claims = False
        if claims and not self.greedy:
            raise EngineError(P.TS_ERR_INTERNAL, f"engine '{engine.name}' claims "
                              "TS_CAP_DEVICE_GREEDY but its session class has no prefill_greedy")
        try:
            device = str(engine.device_name())
        except Exception as e:
            device = f"unknown device ({_last_line(e)})"
        self.engine = engine
        serving = self.version >= 4
        self.has_step_batch = serving and _overrides(engine, "step_batch")
        self.has_fork = serving and _overrides(engine, "fork")
        self.has_grammar = self.version >= 5 and _has(cls, "compile_grammar")
        has_pe, has_dim = _has(cls, "prefill_embeddings"), _has(cls, "n_embd")
        if has_pe != has_dim:
            raise EngineError(P.TS_ERR_INTERNAL, f"engine '{engine.name}': its session class "
                              "defines only one of prefill_embeddings and n_embd (both or neither)")
        self.has_embeddings = self.version >= 6 and has_pe
        return P.BackendInfo(
            protocol_version=self.version, api_version=P.API_VERSION_OF[self.version],
            name=str(engine.name), version=str(engine.version), path=self.command_line,
            device=device, device_greedy=self.greedy,
            declares_models=engine.architectures is not None,
            architectures=str(engine.architectures or ""),
            model_features=str(engine.model_features or ""), taps=self.taps,
            step_batch=self.has_step_batch, fork=self.has_fork, grammar=self.has_grammar,
            embeddings=self.has_embeddings)

    # ---- the loop ----
    def run(self):
        """Exit status: 0 when the harness closed the socket."""
        if not self.hello():
            return 0
        while True:
            got = self._read_frame(P.MAX_REQUEST_PAYLOAD)
            if got is None:
                return 0
            op, body = got
            self._reply(op, self.dispatch(op, body))

    def dispatch(self, op, body):
        """The reply payload of one request (bytes, or a list of parts); every
        failure becomes a status."""
        r = P.Reader(body, f"{P.op_name(op)} request")
        handler = _HANDLERS.get(op)
        try:
            if handler is None:
                raise EngineError(P.TS_ERR_INTERNAL, f"unexpected op {op}")
            return handler(self, r)
        except EngineError as e:
            return P.error_payload(e.status, e.message)
        except P.ProtocolError as e:
            return P.error_payload(P.TS_ERR_INVALID_ARGUMENT, str(e))
        except MemoryError:
            return P.error_payload(P.TS_ERR_OUT_OF_MEMORY, "out of memory")
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            return P.error_payload(P.TS_ERR_INTERNAL, _last_line(e))

    # ---- checks every engine gets (touchstone/abi/backend_adapter.hpp) ----
    def _new_handle(self):
        h = self._next
        self._next += 1
        return h

    def _model(self, r):
        h = r.u64("model")
        if h not in self.models:
            raise EngineError(P.TS_ERR_INTERNAL, f"unknown model handle {h}")
        return h

    def _session(self, r):
        h = r.u64("session")
        if h not in self.sessions:
            raise EngineError(P.TS_ERR_INTERNAL, f"unknown session handle {h}")
        return h

    def _tokens(self, r, fn):
        n = r.i32("n_tokens")
        if n < 0 or n * 4 != r.remaining():
            raise EngineError(P.TS_ERR_INTERNAL, f"{fn}: n_tokens {n} does not match the "
                              f"{r.remaining()} bytes of tokens")
        return r.i32s("tokens", n)

    def _appendable(self, h, tokens, fn):
        """check_tokens + check_room; returns (session, position before)."""
        session, n_vocab = self.sessions[h][:2]
        if not tokens:
            raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"{fn}: null buffer or n_tokens <= 0")
        for i, t in enumerate(tokens):
            if t < 0 or t >= n_vocab:
                raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                                  f"token #{i} = {t} outside [0, {n_vocab})")
        pos = _index(session.position(), "position()")
        max_ctx = _index(session.max_context(), "max_context()")
        if pos + len(tokens) > max_ctx:
            raise EngineError(P.TS_ERR_CONTEXT_FULL, f"position {pos} + {len(tokens)} tokens "
                              f"exceeds max context {max_ctx}")
        return session, pos

    def _appended(self, session, before, n, fn):
        after = _index(session.position(), "position()")
        if after != before + n:
            raise EngineError(P.TS_ERR_INTERNAL, f"{fn}: position() is {after} after appending "
                              f"{n} tokens at position {before} (expected {before + n})")

    def _under_grammar(self, h, tokens, before, fn, n_rows, compute):
        """compute() with `tokens` run through the session's grammar first (a refused
        token fails the call before the engine sees it; a failing compute() undoes
        the grammar); keeps the call's rows (n_rows) for grammar_greedy."""
        g = self.grammars.get(h)
        self.rows.pop(h, None)
        if g is not None:
            g.take(tokens, before, fn)
        try:
            out = compute()
        except BaseException:
            if g is not None:
                g.undo(len(tokens))
            raise
        if n_rows:
            self.rows[h] = G.LastRows(out, n_rows, before + len(tokens))
        return out

    # ---- handlers ----
    def capabilities(self, r):
        r.finish()
        caps = self.engine.capabilities()
        if self.greedy:
            caps.flags |= P.TS_CAP_DEVICE_GREEDY
        # ABI v6, as the C++ adapter does: the flags say what the engine has.
        if self.has_fork:
            caps.flags |= P.TS_CAP_KV_PREFIX_COPY
        else:
            caps.flags &= ~P.TS_CAP_KV_PREFIX_COPY
        if not self.has_step_batch:
            caps.flags &= ~P.TS_CAP_BATCHED_SESSIONS
        if self.has_grammar:
            caps.flags |= P.TS_CAP_STRUCTURED_OUTPUT
        else:
            caps.flags &= ~P.TS_CAP_STRUCTURED_OUTPUT
        if self.has_embeddings:
            caps.flags |= P.TS_CAP_EMBEDDING_INPUT
        else:
            caps.flags &= ~P.TS_CAP_EMBEDDING_INPUT
        caps.flags &= ~P.TS_CAP_MULTIMODAL  # no vision tower through serve()
        if self.version < 4:
            caps.flags &= ~P.TS_CAP_V6_FLAGS
        return caps.encode(P.Writer().i32(P.TS_OK), self.version).bytes()

    def load_model(self, r):
        path = r.str("path")
        r.finish()
        model = self.engine.load_model(path)
        n = getattr(model, "n_vocab", None)
        n = _index(n() if callable(n) else n, "the model's n_vocab")
        if not 0 < n < 2**31:
            raise EngineError(P.TS_ERR_INTERNAL, f"load_model: n_vocab is {n}, must be in "
                              "[1, 2^31)")
        h = self._new_handle()
        self.models[h] = [model, n]
        return P.Writer().i32(P.TS_OK).u64(h).i32(n).bytes()

    def free_model(self, r):
        h = self._model(r)
        r.finish()
        model = self.models.pop(h)[0]
        self.engine.free_model(model)
        return P.Writer().i32(P.TS_OK).bytes()

    def open_session(self, r):
        m = self._model(r)
        o = SessionOptions(r.i32("weight_path"), r.i32("n_threads"), r.i32("max_context"),
                           r.str("fault"))
        r.finish()
        if o.weight_path not in (P.TS_WEIGHTS_FULL_PRECISION, P.TS_WEIGHTS_QUANTIZED):
            raise EngineError(P.TS_ERR_INVALID_ARGUMENT, "open_session: unknown weight path")
        if o.n_threads < 0 or o.max_context < 0:
            raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                              "open_session: negative n_threads or max_context")
        known = tuple(getattr(self.engine, "faults", ()) or ())
        if o.fault and o.fault not in known:
            raise EngineError(P.TS_ERR_UNSUPPORTED, f"unknown fault '{o.fault}' (known: "
                              f"{', '.join(known) or 'none'})")
        model, n_vocab = self.models[m]
        session = self.engine.open_session(model, o)
        if session is None:
            raise EngineError(P.TS_ERR_INTERNAL, "open_session returned None")
        h = self._new_handle()
        self.sessions[h] = [session, n_vocab, m, o.weight_path]
        return P.Writer().i32(P.TS_OK).u64(h).bytes()

    def free_session(self, r):
        h = self._session(r)
        r.finish()
        session = self.sessions.pop(h)[0]
        self.grammars.pop(h, None)
        self.rows.pop(h, None)
        close = getattr(session, "close", None)
        if callable(close):
            close()
        return P.Writer().i32(P.TS_OK).bytes()

    def prefill(self, r):
        h = self._session(r)
        all_positions = r.i32("all_positions") != 0
        tokens = self._tokens(r, "prefill")
        session, before = self._appendable(h, tokens, "prefill")
        fn = "prefill(all positions)" if all_positions else "prefill"
        n_rows = len(tokens) if all_positions else 1

        def compute():
            data = f32_bytes(session.prefill(tokens, all_positions), self.sessions[h][1] * n_rows,
                             fn)
            self._appended(session, before, len(tokens), fn)
            return data
        data = self._under_grammar(h, tokens, before, "prefill", n_rows, compute)
        return [P.Writer().i32(P.TS_OK).bytes(), data]

    def decode(self, r):
        h = self._session(r)
        token = r.i32("token")
        r.finish()
        session, before = self._appendable(h, [token], "decode")

        def compute():
            data = f32_bytes(session.decode(token), self.sessions[h][1], "decode")
            self._appended(session, before, 1, "decode")
            return data
        data = self._under_grammar(h, [token], before, "decode", 1, compute)
        return [P.Writer().i32(P.TS_OK).bytes(), data]

    def prefill_greedy(self, r):
        h = self._session(r)
        tokens = self._tokens(r, "prefill_greedy")
        if not self.greedy:
            raise EngineError(P.TS_ERR_INTERNAL,
                              "backend has no device greedy (TS_CAP_DEVICE_GREEDY)")
        session, before = self._appendable(h, tokens, "prefill_greedy")

        def compute():
            token = _index(session.prefill_greedy(tokens), "prefill_greedy")
            if not -2**31 <= token < 2**31:
                raise EngineError(P.TS_ERR_INTERNAL, f"prefill_greedy returned {token}")
            self._appended(session, before, len(tokens), "prefill_greedy")
            return token
        token = self._under_grammar(h, tokens, before, "prefill_greedy", 0, compute)
        return P.Writer().i32(P.TS_OK).i32(token).bytes()

    def rewind(self, r):
        h = self._session(r)
        p = r.i32("position")
        r.finish()
        session = self.sessions[h][0]
        pos = _index(session.position(), "position()")
        if p < 0 or p > pos:
            raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"rewind to {p} outside [0, {pos}]")
        session.rewind(p)
        self.rows.pop(h, None)
        if h in self.grammars and self.grammars[h].rewound(p) is None:
            del self.grammars[h]  # rewound to before set_grammar's position: removed
        return P.Writer().i32(P.TS_OK).bytes()

    def position(self, r):
        h = self._session(r)
        r.finish()
        pos = _index(self.sessions[h][0].position(), "position()")
        return P.Writer().i32(P.TS_OK).i32(pos).bytes()

    def set_taps(self, r):
        h = self._session(r)
        enable = r.i32("enable") != 0
        r.finish()
        if not self.taps:
            raise EngineError(P.TS_ERR_INTERNAL, "backend has no layer taps (ABI v4)")
        self.sessions[h][0].set_taps(enable)
        return P.Writer().i32(P.TS_OK).bytes()

    def read_taps(self, r):
        h = self._session(r)
        n = r.u64("n_floats")
        r.finish()
        if not self.taps:
            raise EngineError(P.TS_ERR_INTERNAL, "backend has no layer taps (ABI v4)")
        if n == 0 or n > 1 << 28:
            raise EngineError(P.TS_ERR_INTERNAL, f"read_taps: n_floats {n} outside [1, 2^28]")
        taps = self.sessions[h][0].read_taps()
        data = b"" if taps is None else f32_bytes(taps, _size_of(taps), "read_taps")
        size = len(data) // 4
        if size == 0:
            raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                              "read_taps: nothing recorded (set_taps(1) first, then a call)")
        if size != n:
            raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"read_taps: n_floats {n} != n_layer x "
                              f"{P.TS_TAP_POINTS} x n_embd = {size}")
        return [P.Writer().i32(P.TS_OK).bytes(), data]


class _Batch:
    """The checks of a step_batch request (touchstone/abi/backend_adapter.hpp's
    batch_items), each message naming the entry."""

    def __init__(self, server, request):
        caps = server.engine.capabilities()
        if caps.max_batch > 0 and len(request) > caps.max_batch:
            raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"step_batch: {len(request)} entries, "
                              f"max_batch is {caps.max_batch}")
        self.entries, self.before, self.sizes = [], [], []
        first = None
        for i, (h, tokens, all_positions) in enumerate(request):
            at = f"step_batch: entry {i}: "
            if h not in server.sessions:
                raise EngineError(P.TS_ERR_INTERNAL, f"{at}unknown session handle {h}")
            _, n_vocab, model, path = server.sessions[h]
            first = first or (model, path)
            try:
                if model != first[0]:
                    raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                                      "a session of another model than entry 0's")
                if path != first[1]:
                    raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                                      "a session of another weight path than entry 0's")
                if any(h == prev for prev, _, _ in request[:i]):
                    raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                                      "the same session twice in one call")
                if all_positions and not caps.flags & P.TS_CAP_ALL_POSITION_LOGITS:
                    raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                                      "all_positions without TS_CAP_ALL_POSITION_LOGITS")
                session, pos = server._appendable(h, tokens, "prefill")
            except EngineError as e:
                raise EngineError(e.status, at + e.message) from None
            self.entries.append(BatchEntry(session, tokens, all_positions))
            self.before.append(pos)
            self.sizes.append(n_vocab * (len(tokens) if all_positions else 1))

    def rollback(self):
        """No session changes position on an error."""
        for e, pos in zip(self.entries, self.before):
            try:
                if _index(e.session.position(), "position()") > pos:
                    e.session.rewind(pos)
            except Exception:  # the original error is the one to report
                traceback.print_exc(file=sys.stderr)


def step_batch(server, r):
    """STEP_BATCH: the engine's step_batch over the checked entries; the reply is
    every entry's logits in entry order."""
    request = P.decode_step_batch(r)
    if not server.has_step_batch:
        raise EngineError(P.TS_ERR_UNSUPPORTED, "backend has no step_batch (ABI v6)")
    batch = _Batch(server, request)
    handles = [h for h, _, _ in request]
    taken = []
    try:
        for i, (h, e) in enumerate(zip(handles, batch.entries)):
            server.rows.pop(h, None)
            g = server.grammars.get(h)
            if g is not None:
                try:
                    g.take(e.tokens, batch.before[i], "prefill")
                except EngineError as err:
                    raise EngineError(err.status, f"step_batch: entry {i}: {err.message}") from None
                taken.append((g, len(e.tokens)))
        out = server.engine.step_batch(batch.entries)
        if out is None or len(out) != len(batch.entries):
            raise EngineError(P.TS_ERR_INTERNAL, f"step_batch returned "
                              f"{'None' if out is None else len(out)} results for "
                              f"{len(batch.entries)} entries")
        parts = [P.Writer().i32(P.TS_OK).bytes()]
        for i, (e, logits, size) in enumerate(zip(batch.entries, out, batch.sizes)):
            fn = f"step_batch (entry {i})"
            parts.append(f32_bytes(logits, size, fn))
            server._appended(e.session, batch.before[i], len(e.tokens), fn)
        for i, (h, e) in enumerate(zip(handles, batch.entries)):
            n_rows = len(e.tokens) if e.all_positions else 1
            server.rows[h] = G.LastRows(parts[1 + i], n_rows, batch.before[i] + len(e.tokens))
        return parts
    except BaseException:
        for g, n in taken:
            g.undo(n)
        batch.rollback()
        raise


def fork_session(server, r):
    """FORK_SESSION: the engine's fork, range-checked; the new session's handle."""
    h = server._session(r)
    n_prefix = r.i32("n_prefix")
    r.finish()
    if not server.has_fork:
        raise EngineError(P.TS_ERR_UNSUPPORTED, "backend has no fork_session (ABI v6)")
    session, n_vocab, model, path = server.sessions[h]
    pos = _index(session.position(), "position()")
    if n_prefix < 0 or n_prefix > pos:
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                          f"fork_session: n_prefix {n_prefix} outside [0, {pos}]")
    forked = server.engine.fork(session, n_prefix)
    if forked is None or forked is session:
        raise EngineError(P.TS_ERR_INTERNAL, "fork returned " +
                          ("None" if forked is None else "the source session"))
    got = _index(forked.position(), "the forked session's position()")
    if got != n_prefix:
        raise EngineError(P.TS_ERR_INTERNAL, f"fork_session: the forked session holds {got} "
                          f"positions, not n_prefix = {n_prefix}")
    new = server._new_handle()
    server.sessions[new] = [forked, n_vocab, model, path]
    if h in server.grammars:
        g = server.grammars[h].forked(n_prefix)
        if g is not None:
            server.grammars[new] = g
    return P.Writer().i32(P.TS_OK).u64(new).bytes()


def _grammar_session(server, r, fn):
    h = server._session(r)
    if not server.has_grammar:  # its hello said so; the harness applies grammars itself
        raise EngineError(P.TS_ERR_UNSUPPORTED, f"backend has no {fn} (ABI v7)")
    return h


def set_grammar(server, r):
    """SET_GRAMMAR: the session's compile_grammar(kind, text) from its position on;
    kind -1 removes the grammar."""
    h = _grammar_session(server, r, "set_grammar")
    kind = r.i32("kind")
    text = r.str("text")
    r.finish()
    if kind == -1:
        server.grammars.pop(h, None)
        return P.Writer().i32(P.TS_OK).bytes()
    if kind not in (P.TS_GRAMMAR_JSON_SCHEMA, P.TS_GRAMMAR_GBNF, P.TS_GRAMMAR_REGEX):
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"set_grammar: unknown kind {kind}")
    session = server.sessions[h][0]
    state = session.compile_grammar(kind, text)
    if state is None:
        raise EngineError(P.TS_ERR_INTERNAL, "compile_grammar returned None")
    server.grammars[h] = G.SessionGrammar(state, _index(session.position(), "position()"))
    return P.Writer().i32(P.TS_OK).bytes()


def _grammar_of(server, h, fn):
    if h not in server.grammars:
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"{fn}: the session has no grammar")
    return server.grammars[h]


def grammar_mask(server, r):
    """GRAMMAR_MASK: the allowed set at the session's position."""
    h = _grammar_session(server, r, "grammar_mask")
    n_words = r.i32("n_words")
    r.finish()
    want = G.mask_words(server.sessions[h][1])
    if n_words != want:
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT,
                          f"grammar_mask: n_words {n_words}, TS_MASK_WORDS(n_vocab) is {want}")
    words = G.mask_array(_grammar_of(server, h, "grammar_mask").state, want)
    return [P.Writer().i32(P.TS_OK).bytes(), words.tobytes()]


def grammar_greedy(server, r):
    """GRAMMAR_GREEDY: the constrained greedy picks of the last n rows."""
    h = _grammar_session(server, r, "grammar_greedy")
    n = r.i32("n_positions")
    r.finish()
    g = _grammar_of(server, h, "grammar_greedy")
    session, n_vocab = server.sessions[h][:2]
    picks = G.greedy_picks(g, server.rows.get(h), n_vocab, n,
                           _index(session.position(), "position()"))
    w = P.Writer().i32(P.TS_OK)
    for t in picks:
        w.i32(t)
    return w.bytes()


def prefill_embeddings(server, r):
    """PREFILL_EMBEDDINGS (ABI v8): n rows of input embeddings appended as a prefill;
    checked as the C++ adapter checks them (sizes, the model's n_embd, room, no grammar)."""
    if not server.has_embeddings:
        raise EngineError(P.TS_ERR_UNSUPPORTED, f"engine '{server.engine.name}' takes no input "
                          "embeddings (ABI v8 TS_CAP_EMBEDDING_INPUT)")
    h = server._session(r)
    all_positions = r.i32("all_positions") != 0
    n, n_embd, bidirectional = r.i32("n_tokens"), r.i32("n_embd"), r.i32("bidirectional") != 0
    if n < 1 or n_embd < 1 or n * n_embd * 4 != r.remaining():
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"prefill_embeddings: {n} x {n_embd} "
                          f"floats do not match the {r.remaining()} bytes sent")
    data = r.raw("embeddings", n * n_embd * 4)
    r.finish()
    session, n_vocab = server.sessions[h][:2]
    want = _index(session.n_embd(), "n_embd()")
    if n_embd != want:
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT, f"prefill_embeddings: n_embd {n_embd} is "
                          f"not the model's embedding width {want}")
    if h in server.grammars:
        raise EngineError(P.TS_ERR_INVALID_ARGUMENT, "prefill_embeddings: a grammar is set on "
                          "the session (grammars constrain tokens)")
    before = _index(session.position(), "position()")
    max_ctx = _index(session.max_context(), "max_context()")
    if before + n > max_ctx:
        raise EngineError(P.TS_ERR_CONTEXT_FULL, f"position {before} + {n} tokens exceeds max "
                          f"context {max_ctx}")
    server.rows.pop(h, None)
    fn = "prefill_embeddings(all positions)" if all_positions else "prefill_embeddings"
    out = session.prefill_embeddings(data, n_embd, bidirectional, all_positions)
    data = f32_bytes(out, n_vocab * (n if all_positions else 1), fn)
    server._appended(session, before, n, fn)
    return [P.Writer().i32(P.TS_OK).bytes(), data]


def _size_of(values):
    """Number of values in an array-like (NumPy size, buffer or nested sequence)."""
    if hasattr(values, "size") and not callable(values.size):
        return int(values.size)
    try:
        mv = memoryview(values)
        return mv.nbytes // max(1, mv.itemsize)
    except TypeError:
        return sum(1 for _ in _flatten(values))


_HANDLERS = {
    P.CAPABILITIES: Server.capabilities,
    P.LOAD_MODEL: Server.load_model,
    P.FREE_MODEL: Server.free_model,
    P.OPEN_SESSION: Server.open_session,
    P.FREE_SESSION: Server.free_session,
    P.PREFILL: Server.prefill,
    P.DECODE: Server.decode,
    P.PREFILL_GREEDY: Server.prefill_greedy,
    P.REWIND: Server.rewind,
    P.POSITION: Server.position,
    P.SET_TAPS: Server.set_taps,
    P.READ_TAPS: Server.read_taps,
    P.STEP_BATCH: step_batch,
    P.FORK_SESSION: fork_session,
    P.SET_GRAMMAR: set_grammar,
    P.GRAMMAR_MASK: grammar_mask,
    P.GRAMMAR_GREEDY: grammar_greedy,
    P.PREFILL_EMBEDDINGS: prefill_embeddings,
}


def command_line():
    """How this process was started ("python3 -m package.module ...")."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable] + sys.argv
    return " ".join(argv)


NOT_A_SOCKET = (
    "touchstone_engine: fd {fd} is not a socket: this program is an engine that the "
    "touchstone harness starts, e.g.\n"
    "  touchstone parity --backend \"exec:{cmd}\" --manifest goldens/manifest.json\n")


def run(engine, fd=3, redirect_stdout=True):
    """Serves `engine` (an Engine subclass, instance or factory) on fd; returns the
    exit status (0 when the harness closed the connection)."""
    try:
        is_socket = stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        is_socket = False
    if not is_socket:
        sys.stderr.write(NOT_A_SOCKET.format(fd=fd, cmd=command_line()))
        return 2
    if redirect_stdout:
        # The report is the harness's stdout: nothing of ours may reach it.
        sys.stdout.flush()
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    sock = socket.socket(fileno=fd)
    try:
        return Server(engine, sock, command_line()).run()
    except P.ProtocolError as e:  # a malformed request frame: the harness is broken
        sys.stderr.write(f"touchstone_engine: {e}\n")
        return 2
    finally:
        sock.detach()


def serve(engine, fd=3):
    """Runs the protocol loop for `engine` on fd 3 and exits the process when
    the harness closes the connection."""
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C: die quietly with the harness
    sys.stderr.flush()
    code = run(engine, fd)
    sys.stderr.flush()
    sys.exit(code)
