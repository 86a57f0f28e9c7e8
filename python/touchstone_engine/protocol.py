"""The child-process protocol, version 4 (docs/protocol.md): frames and fields.

Standard library only. Every frame is

    u32 magic 'TSP1' | u32 op | u64 payload_len | payload[payload_len]

little-endian. A reply carries ``op | REPLY_BIT`` and its payload starts with an
i32 ts_status; a status other than TS_OK is followed by an error string and
nothing else. Strings are u32 length + bytes; logits are raw little-endian fp32.
Mirrors parity/runtime/include/touchstone/runtime/protocol.h; decoding is bounds-checked
and raises ProtocolError naming the message and the field.
"""

import struct

VERSION = 7
MIN_VERSION = 3  # the oldest harness an engine still answers (with that version's fields)
API_VERSION = 9  # TS_BACKEND_API_VERSION of common/include/touchstone/abi/backend_abi.h
API_VERSION_OF = {3: 5, 4: 6, 5: 7, 6: 8, 7: API_VERSION}  # the newest ABI each protocol version carries
MAGIC = 0x31505354  # bytes "TSP1"
REPLY_BIT = 0x8000
HEADER_SIZE = 16
MAX_REQUEST_PAYLOAD = 64 << 20

# ops
HELLO = 1
CAPABILITIES = 2
LOAD_MODEL = 3
FREE_MODEL = 4
OPEN_SESSION = 5
FREE_SESSION = 6
PREFILL = 7
DECODE = 8
REWIND = 9
POSITION = 10
PREFILL_GREEDY = 11
SET_TAPS = 12
READ_TAPS = 13
STEP_BATCH = 14  # version 4 (ABI v6)
FORK_SESSION = 15  # version 4 (ABI v6)
SET_GRAMMAR = 16  # version 5 (ABI v7)
GRAMMAR_MASK = 17  # version 5 (ABI v7)
GRAMMAR_GREEDY = 18  # version 5 (ABI v7)
PREFILL_EMBEDDINGS = 19  # version 6 (ABI v8)
LOAD_VISION = 20  # version 6 (ABI v8)
ENCODE_IMAGE = 21  # version 6 (ABI v8)
PREPROCESS_IMAGE = 22  # version 7 (ABI v9)
SET_VISION_OPTIONS = 23  # version 7 (ABI v9)
MAX_BATCH_ENTRIES = 1 << 16

OP_NAMES = {
    HELLO: "hello",
    CAPABILITIES: "capabilities",
    LOAD_MODEL: "load_model",
    FREE_MODEL: "free_model",
    OPEN_SESSION: "open_session",
    FREE_SESSION: "free_session",
    PREFILL: "prefill",
    DECODE: "decode",
    REWIND: "rewind",
    POSITION: "position",
    PREFILL_GREEDY: "prefill_greedy",
    SET_TAPS: "set_taps",
    READ_TAPS: "read_taps",
    STEP_BATCH: "step_batch",
    FORK_SESSION: "fork_session",
    SET_GRAMMAR: "set_grammar",
    GRAMMAR_MASK: "grammar_mask",
    GRAMMAR_GREEDY: "grammar_greedy",
    PREFILL_EMBEDDINGS: "prefill_embeddings",
    LOAD_VISION: "load_vision",
    ENCODE_IMAGE: "encode_image",
    PREPROCESS_IMAGE: "preprocess_image",
    SET_VISION_OPTIONS: "set_vision_options",
}

# ts_status
TS_OK = 0
TS_ERR_INVALID_ARGUMENT = 1
TS_ERR_UNSUPPORTED = 2
TS_ERR_IO = 3
TS_ERR_OUT_OF_MEMORY = 4
TS_ERR_CONTEXT_FULL = 5
TS_ERR_DEVICE = 6
TS_ERR_INTERNAL = 7
STATUS_NAMES = {
    TS_OK: "TS_OK",
    TS_ERR_INVALID_ARGUMENT: "TS_ERR_INVALID_ARGUMENT",
    TS_ERR_UNSUPPORTED: "TS_ERR_UNSUPPORTED",
    TS_ERR_IO: "TS_ERR_IO",
    TS_ERR_OUT_OF_MEMORY: "TS_ERR_OUT_OF_MEMORY",
    TS_ERR_CONTEXT_FULL: "TS_ERR_CONTEXT_FULL",
    TS_ERR_DEVICE: "TS_ERR_DEVICE",
    TS_ERR_INTERNAL: "TS_ERR_INTERNAL",
}

# ts_capabilities.flags
TS_CAP_ALL_POSITION_LOGITS = 1 << 0
TS_CAP_DEVICE_GREEDY = 1 << 1
TS_CAP_BATCHED_SESSIONS = 1 << 2
TS_CAP_KV_PREFIX_COPY = 1 << 3
TS_CAP_BITWISE_DETERMINISM = 1 << 4
TS_CAP_STATIC_SHAPES = 1 << 5
TS_CAP_TOP_N_LOGPROBS = 1 << 6  # ABI v5: rows of top_n log-probabilities, -inf elsewhere
TS_CAP_BATCH_INVARIANT = 1 << 7  # ABI v6: a token's bits independent of the rest of the call
# ABI v6 (issue 37): with TS_CAP_BITWISE_DETERMINISM, the claim stops at fork_session
TS_CAP_BITWISE_NOT_ACROSS_FORKS = 1 << 8
TS_CAP_V6_FLAGS = (TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY | TS_CAP_BATCH_INVARIANT
                   | TS_CAP_BITWISE_NOT_ACROSS_FORKS)
# ABI v7: the engine enforces grammars itself (set_grammar, grammar_mask, grammar_greedy)
TS_CAP_STRUCTURED_OUTPUT = 1 << 9
TS_CAP_EMBEDDING_INPUT = 1 << 10  # ABI v8: prefill_embeddings
TS_CAP_MULTIMODAL = 1 << 11  # ABI v8: load_vision, encode_image
# ts_grammar_kind (set_grammar)
TS_GRAMMAR_JSON_SCHEMA = 0
TS_GRAMMAR_GBNF = 1
TS_GRAMMAR_REGEX = 2

# ts_weight_path
TS_WEIGHTS_FULL_PRECISION = 0
TS_WEIGHTS_QUANTIZED = 1

# layer taps: points per layer, in this order
TS_TAP_ATTN_OUT = 0
TS_TAP_FFN_OUT = 1
TS_TAP_RESIDUAL = 2
TS_TAP_POINTS = 3

# GGUF ggml_type numbers, for Capabilities.weight_types (bit i = type i)
GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
              "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}


def weight_type_bit(name_or_type):
    """TS_WEIGHT_TYPE_BIT: 1 << ggml_type ("Q4_1" or 3)."""
    t = GGML_TYPES[name_or_type] if isinstance(name_or_type, str) else int(name_or_type)
    return 1 << t


class ProtocolError(Exception):
    """A malformed frame or payload (names the message and the field)."""


def op_name(op):
    return OP_NAMES.get(op & ~REPLY_BIT, "unknown op")


def negotiate(requested):
    """The version an engine answers a hello asking for `requested` with: an
    older harness (>= MIN_VERSION) gets its own; any other gets VERSION."""
    return requested if MIN_VERSION <= requested < VERSION else VERSION


def parse_header(data, max_payload):
    """(op, payload_len) of a 16-byte header; ProtocolError on a wrong magic or
    a payload above max_payload (checked before anything is allocated)."""
    if len(data) != HEADER_SIZE:
        raise ProtocolError(f"frame header: {len(data)} bytes, expected {HEADER_SIZE}")
    magic, op, n = struct.unpack("<IIQ", data)
    if magic != MAGIC:
        raise ProtocolError(f"frame header: magic 0x{magic:08x}, expected 0x{MAGIC:08x} ('TSP1')")
    if n > max_payload:
        raise ProtocolError(f"frame header ({op_name(op)}): payload of {n} bytes exceeds "
                            f"the limit of {max_payload}")
    return op, n


def frame(op, payload):
    """Header + payload (bytes-like), ready to send."""
    return struct.pack("<IIQ", MAGIC, op, len(payload)) + bytes(payload)


class Writer:
    """Builds a payload; every method returns self."""

    def __init__(self):
        self._parts = []

    def u32(self, v):
        self._parts.append(struct.pack("<I", v & 0xFFFFFFFF))
        return self

    def i32(self, v):
        self._parts.append(struct.pack("<i", v))
        return self

    def u64(self, v):
        self._parts.append(struct.pack("<Q", v))
        return self

    def str(self, s):
        b = s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)
        self.u32(len(b))
        self._parts.append(b)
        return self

    def i32s(self, values):
        self._parts.append(struct.pack(f"<{len(values)}i", *values))
        return self

    def raw(self, data):
        """Bytes as they are (fp32 logits already little-endian)."""
        self._parts.append(data)
        return self

    def bytes(self):
        return b"".join(bytes(p) for p in self._parts)


class Reader:
    """Reads a payload; `what` names the message in errors ("prefill request")."""

    def __init__(self, data, what):
        self._b = memoryview(data)
        self._pos = 0
        self._what = what

    def remaining(self):
        return len(self._b) - self._pos

    def _take(self, n, field):
        if n > self.remaining():
            raise ProtocolError(f"{self._what}: field '{field}' needs {n} bytes at offset "
                                f"{self._pos}, {self.remaining()} left")
        s = self._b[self._pos:self._pos + n]
        self._pos += n
        return s

    def u32(self, field):
        return struct.unpack("<I", self._take(4, field))[0]

    def i32(self, field):
        return struct.unpack("<i", self._take(4, field))[0]

    def u64(self, field):
        return struct.unpack("<Q", self._take(8, field))[0]

    def str(self, field, max_len=1 << 20):
        n = self.u32(field)
        if n > max_len:
            raise ProtocolError(f"{self._what}: string '{field}' of {n} bytes exceeds the "
                                f"limit of {max_len}")
        return bytes(self._take(n, field)).decode("utf-8", "surrogateescape")

    def i32s(self, field, n):
        return list(struct.unpack(f"<{n}i", self._take(4 * n, field)))

    def f32s(self, field, n):
        return list(struct.unpack(f"<{n}f", self._take(4 * n, field)))

    def raw(self, field, n):
        """The next n bytes as they are."""
        return bytes(self._take(n, field))

    def finish(self):
        if self.remaining() != 0:
            raise ProtocolError(f"{self._what}: {self.remaining()} unexpected trailing bytes "
                                f"at offset {self._pos}")


class Capabilities:
    """ts_capabilities: flags (TS_CAP_*), weight_types (weight_type_bit(...)),
    max_context (0 = the model's), shape_buckets (static prefill lengths, at most 16),
    determinism_note (why not bitwise deterministic, or ""), top_n (ABI v5: with
    TS_CAP_TOP_N_LOGPROBS, log-probabilities per row; else 0), batch_invariant_paths
    (ABI v6: with TS_CAP_BATCH_INVARIANT, bit 1 << TS_WEIGHTS_* per covered path,
    0 = all) and max_batch (ABI v6: most step_batch entries, 0 = no limit)."""

    def __init__(self, flags=0, weight_types=0, max_context=0, shape_buckets=(),
                 determinism_note="", top_n=0, batch_invariant_paths=0, max_batch=0):
        self.flags = flags
        self.weight_types = weight_types
        self.max_context = max_context
        self.shape_buckets = list(shape_buckets)
        self.determinism_note = determinism_note or ""
        self.top_n = top_n
        self.batch_invariant_paths = batch_invariant_paths
        self.max_batch = max_batch

    def encode(self, w, version=VERSION):
        buckets = self.shape_buckets[:16]
        w.u32(self.flags).u64(self.weight_types).i32(self.max_context).i32(len(buckets))
        w.i32s(buckets).str(self.determinism_note).i32(self.top_n)
        if version >= 4:
            w.u32(self.batch_invariant_paths).i32(self.max_batch)
        return w

    @staticmethod
    def decode(r, version=VERSION):
        c = Capabilities(flags=r.u32("flags"), weight_types=r.u64("weight_types"),
                         max_context=r.i32("max_context"))
        n = r.i32("n_shape_buckets")
        if n < 0 or n > 16:
            raise ProtocolError(f"capabilities reply: n_shape_buckets {n} outside [0, 16]")
        c.shape_buckets = r.i32s("shape_buckets", n)
        c.determinism_note = r.str("determinism_note", 1 << 16)
        c.top_n = r.i32("top_n") if r.remaining() >= 4 else 0  # ABI v5, optional
        if version >= 4 and r.remaining() >= 8:  # ABI v6, optional
            c.batch_invariant_paths = r.u32("batch_invariant_paths")
            c.max_batch = r.i32("max_batch")
            if c.max_batch < 0:
                raise ProtocolError(f"capabilities reply: max_batch {c.max_batch} < 0")
        else:
            c.flags &= ~TS_CAP_V6_FLAGS
        if version < 5:  # ABI v7 (protocol 5): an older peer has no grammar calls
            c.flags &= ~TS_CAP_STRUCTURED_OUTPUT
        if version < 6:  # ABI v8 (protocol 6): nor multimodal calls
            c.flags &= ~(TS_CAP_EMBEDDING_INPUT | TS_CAP_MULTIMODAL)
        return c


class BackendInfo:
    """The hello reply after TS_OK; the fields a protocol version added are
    encoded and decoded only from that version (protocol_version comes first)."""

    FIELDS = ("protocol_version", "api_version", "name", "version", "path", "device",
              "device_greedy", "declares_models", "architectures", "model_features", "taps",
              "step_batch", "fork", "grammar", "embeddings", "vision", "preprocess",
              "vision_options")

    def __init__(self, **kw):
        self.protocol_version = VERSION
        self.api_version = API_VERSION
        self.name = self.version = self.path = self.device = ""
        self.device_greedy = self.declares_models = self.taps = False
        self.step_batch = self.fork = False
        self.grammar = False  # ABI v7, protocol >= 5
        self.embeddings = self.vision = False  # ABI v8, protocol >= 6
        self.preprocess = self.vision_options = False  # ABI v9, protocol >= 7
        self.architectures = self.model_features = ""
        for k, v in kw.items():
            if k not in self.FIELDS:
                raise TypeError(f"BackendInfo has no field {k!r}")
            setattr(self, k, v)

    def encode(self, w):
        v = self.protocol_version
        w.u32(v).u32(self.api_version)
        w.str(self.name).str(self.version).str(self.path).str(self.device)
        w.u32(1 if self.device_greedy else 0)
        if v >= 2:
            w.u32(1 if self.declares_models else 0).str(self.architectures)
            w.str(self.model_features)
        if v >= 3:
            w.u32(1 if self.taps else 0)
        if v >= 4:
            w.u32(1 if self.step_batch else 0).u32(1 if self.fork else 0)
        if v >= 5:
            w.u32(1 if self.grammar else 0)
        if v >= 6:
            w.u32(1 if self.embeddings else 0).u32(1 if self.vision else 0)
        if v >= 7:
            w.u32(1 if self.preprocess else 0).u32(1 if self.vision_options else 0)
        return w

    @staticmethod
    def decode(r):
        i = BackendInfo()
        i.protocol_version = v = r.u32("protocol_version")
        i.api_version = r.u32("api_version")
        i.name = r.str("name", 4096)
        i.version = r.str("version", 4096)
        i.path = r.str("path", 1 << 16)
        i.device = r.str("device", 1 << 16)
        i.device_greedy = r.u32("device_greedy") != 0
        if v >= 2:
            i.declares_models = r.u32("declares_models") != 0
            i.architectures = r.str("architectures", 4096)
            i.model_features = r.str("model_features", 4096)
        if v >= 3:
            i.taps = r.u32("taps") != 0
        if v >= 4:
            i.step_batch = r.u32("step_batch") != 0
            i.fork = r.u32("fork") != 0
        if v >= 5:
            i.grammar = r.u32("grammar") != 0
        if v >= 6:
            i.embeddings = r.u32("embeddings") != 0
            i.vision = r.u32("vision") != 0
        if v >= 7:
            i.preprocess = r.u32("preprocess") != 0
            i.vision_options = r.u32("vision_options") != 0
        return i


def encode_step_batch(w, entries):
    """STEP_BATCH request: entries are (session handle, tokens, all_positions)."""
    w.u32(len(entries))
    for session, tokens, all_positions in entries:
        w.u64(session).i32(1 if all_positions else 0).i32(len(tokens)).i32s(tokens)
    return w


def decode_step_batch(r):
    """[(session handle, tokens, all_positions)] of a STEP_BATCH request; n_entries
    and every n_tokens are bounded by the bytes left before anything is read."""
    n = r.u32("n_entries")
    if n == 0 or n > MAX_BATCH_ENTRIES or n > r.remaining() // 16:
        raise ProtocolError(f"step_batch request: n_entries {n} outside [1, {MAX_BATCH_ENTRIES}]"
                            f" or more than {r.remaining()} bytes of entries hold (each needs 16)")
    out = []
    for i in range(n):
        session = r.u64("session")
        all_positions = r.i32("all_positions") != 0
        k = r.i32("n_tokens")
        if k < 0 or k > r.remaining() // 4:
            raise ProtocolError(f"step_batch request: entry {i}: n_tokens {k} for "
                                f"{r.remaining()} bytes left")
        out.append((session, r.i32s("tokens", k), all_positions))
    r.finish()
    return out


def error_payload(status, message):
    """A reply payload for a failed call: i32 status + the message."""
    return Writer().i32(status).str(message).bytes()
