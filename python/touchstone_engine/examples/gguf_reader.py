"""A compact GGUF reader (format version 2 and 3) with NumPy dequantization.

Reads the metadata and the tensor directory with bounds checks (a malformed or
truncated file raises GGUFError naming the offset), maps the tensor data with
numpy.memmap, and dequantizes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q5_K and Q6_K to float32 exactly as model/gguf/src/quant.cpp does
(the same float32 operations in the same order, so the values are bitwise the
reference's). Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

import mmap
import struct

import numpy as np

GGUF_MAGIC = 0x46554747  # "GGUF"

# ggml_type -> (name, block size in elements, block size in bytes)
TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}


class GGUFError(ValueError):
    """A malformed, truncated or unsupported GGUF file."""


class Tensor:
    def __init__(self, name, shape, ggml_type, offset):
        self.name = name
        self.shape = shape  # GGUF order: shape[0] is the contiguous (row) dimension
        self.type = ggml_type
        self.offset = offset  # from the start of the data section
        self.n_elements = int(np.prod(shape, dtype=np.int64)) if shape else 1

    @property
    def type_name(self):
        return TYPES.get(self.type, (f"type {self.type}",))[0]

    def n_bytes(self):
        _, bs, ts = TYPES[self.type]
        return self.n_elements // bs * ts


class GGUFFile:
    """gguf = GGUFFile(path); gguf.metadata["llama.block_count"];
    gguf.tensors["blk.0.attn_q.weight"]; gguf.dequantize(name) -> float32 ndarray
    of shape reversed(t.shape) (row-major: [rows, row_length])."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:  # FileNotFoundError etc. propagate as they are
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as e:  # an empty file cannot be mapped
                raise GGUFError(f"{path}: cannot map: {e}") from None
        self._data = np.frombuffer(self._map, dtype=np.uint8)
        self._pos = 0
        self.metadata = {}
        self.tensors = {}
        self._parse()

    # ---- header ----
    def _take(self, n, what):
        if n < 0 or self._pos + n > len(self._data):
            raise GGUFError(f"{self.path}: truncated at offset {self._pos} reading {what} "
                            f"({n} bytes, file has {len(self._data)})")
        b = self._map[self._pos:self._pos + n]
        self._pos += n
        return b

    def _scalar(self, fmt, what):
        size = struct.calcsize(fmt)
        if self._pos + size > len(self._data):
            self._take(size, what)  # raises, naming the offset
        v = struct.unpack_from(fmt, self._map, self._pos)[0]
        self._pos += size
        return v

    def _string(self, what):
        n = self._scalar("<Q", what)
        return self._take(n, what).decode("utf-8", "replace")

    def _value(self, t, key, depth=0):
        if t in _SCALARS:
            return self._scalar(_SCALARS[t], key)
        if t == 8:
            return self._string(key)
        if t == 9 and depth == 0:
            at = self._scalar("<I", key)
            n = self._scalar("<Q", key)
            if at in _SCALARS:  # numeric array: one read
                size = struct.calcsize(_SCALARS[at])
                raw = self._take(n * size, key)
                return list(struct.unpack(f"<{n}{_SCALARS[at][1]}", raw))
            if n > len(self._data):
                raise GGUFError(f"{self.path}: array '{key}' claims {n} elements")
            return [self._value(at, key, depth + 1) for _ in range(n)]
        raise GGUFError(f"{self.path}: metadata key '{key}': unknown value type {t}")

    def _parse(self):
        magic = self._scalar("<I", "magic")
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic 0x{magic:08x})")
        version = self._scalar("<I", "version")
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {version} (supported: 2, 3)")
        n_tensors = self._scalar("<Q", "tensor count")
        n_kv = self._scalar("<Q", "metadata count")
        if n_tensors > len(self._data) or n_kv > len(self._data):
            raise GGUFError(f"{self.path}: implausible counts ({n_tensors} tensors, {n_kv} keys)")
        for _ in range(n_kv):
            key = self._string("metadata key")
            self.metadata[key] = self._value(self._scalar("<I", key), key)
        for _ in range(n_tensors):
            name = self._string("tensor name")
            n_dims = self._scalar("<I", name)
            if n_dims > 4:
                raise GGUFError(f"{self.path}: tensor '{name}' has {n_dims} dimensions")
            shape = [self._scalar("<Q", name) for _ in range(n_dims)]
            t = Tensor(name, shape, self._scalar("<I", name), self._scalar("<Q", name))
            self.tensors[name] = t
        align = int(self.metadata.get("general.alignment", 32))
        if align <= 0 or align & (align - 1):
            raise GGUFError(f"{self.path}: general.alignment {align} is not a power of two")
        self._data_start = (self._pos + align - 1) // align * align
        for t in self.tensors.values():
            self._check(t)

    def _check(self, t):
        if t.type not in TYPES:
            return  # reported by dequantize() when the tensor is used
        bs = TYPES[t.type][1]
        if not t.shape or t.shape[0] % bs:
            raise GGUFError(f"{self.path}: tensor '{t.name}': row of {t.shape[:1]} elements is "
                            f"not a multiple of the {t.type_name} block ({bs})")
        end = self._data_start + t.offset + t.n_bytes()
        if end > len(self._data):
            raise GGUFError(f"{self.path}: tensor '{t.name}' ends at byte {end}, the file has "
                            f"{len(self._data)}")

    # ---- tensor data ----
    def raw(self, name):
        t = self.tensors[name]
        start = self._data_start + t.offset
        return self._data[start:start + t.n_bytes()]

    def dequantize(self, name):
        """float32 values of a tensor, shape = reversed GGUF shape."""
        t = self.tensors.get(name)
        if t is None:
            raise GGUFError(f"{self.path}: no tensor '{name}'")
        fn = _DEQUANT.get(t.type)
        if fn is None:
            raise NotImplementedError(f"tensor '{name}': GGUF type {t.type_name} is not "
                                      "dequantized by this reader")
        values = fn(self.raw(name), TYPES[t.type][2])
        return values.reshape(tuple(reversed(t.shape)))


# ---- dequantization: one function per type, blocks as rows of a uint8 matrix ----

def _blocks(raw, nbytes):
    return np.asarray(raw).reshape(-1, nbytes)


def _f16(b, lo):
    return b[:, lo:lo + 2].copy().view("<f2").astype(np.float32)  # [n_blocks, 1]


def _deq_f32(raw, _):
    return np.asarray(raw).view("<f4").astype(np.float32)


def _deq_f16(raw, _):
    return np.asarray(raw).view("<f2").astype(np.float32)


def _deq_bf16(raw, _):
    return (np.asarray(raw).view("<u2").astype(np.uint32) << 16).view(np.float32)


def _nibbles(qs):
    """Low nibbles are elements 0..15 of a 32-block, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _nibbles_f32(qs, offset=0):
    """_nibbles(qs) - offset as float32, written in place (no uint8 temporaries)."""
    out = np.empty((qs.shape[0], 32), np.float32)
    np.bitwise_and(qs, 0x0F, out=out[:, :16], casting="unsafe")
    np.right_shift(qs, 4, out=out[:, 16:], casting="unsafe")
    if offset:
        out -= offset
    return out


def _deq_q4_0(raw, nb):
    b = _blocks(raw, nb)
    q = _nibbles_f32(b[:, 2:18], 8)  # small integers: exact in float32
    q *= _f16(b, 0)
    return q.reshape(-1)


def _deq_q4_1(raw, nb):
    b = _blocks(raw, nb)
    q = _nibbles_f32(b[:, 4:20])
    q *= _f16(b, 0)
    q += _f16(b, 2)
    return q.reshape(-1)


def _high_bits(qh_bytes):
    """Q5 blocks: bit j of the u32 qh is the 5th bit of element j (0..31)."""
    qh = qh_bytes.copy().view("<u4")  # [n_blocks, 1]
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4


def _deq_q5_0(raw, nb):
    b = _blocks(raw, nb)
    q = (_nibbles(b[:, 6:22]) | _high_bits(b[:, 2:6])).astype(np.int32) - 16
    return (q.astype(np.float32) * _f16(b, 0)).reshape(-1)


def _deq_q5_1(raw, nb):
    b = _blocks(raw, nb)
    q = (_nibbles(b[:, 8:24]) | _high_bits(b[:, 4:8])).astype(np.float32)
    return (q * _f16(b, 0) + _f16(b, 2)).reshape(-1)


def _deq_q8_0(raw, nb):
    b = _blocks(raw, nb)
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    q *= _f16(b, 0)
    return q.reshape(-1)


def _scale_min_k4(scales):
    """get_scale_min_k4 for j = 0..7: ([n, 8] scales, [n, 8] mins) as float32."""
    s = scales.astype(np.uint8)
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _deq_q4_k(raw, nb):
    b = _blocks(raw, nb)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _scale_min_k4(b[:, 4:16])
    qs = b[:, 16:144].reshape(-1, 4, 32)  # 4 chunks of 32 bytes = 64 elements each
    q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    dl = (d * sc)[:, :, None]
    ml = (dmin * mn)[:, :, None]
    return (dl * q - ml).reshape(-1)


def _deq_q5_k(raw, nb):
    b = _blocks(raw, nb)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _scale_min_k4(b[:, 4:16])
    qh = b[:, 16:48]  # [n, 32]
    ql = b[:, 48:176].reshape(-1, 4, 32)
    lo = np.stack([ql & 0xF, ql >> 4], axis=2).reshape(-1, 8, 32)
    shifts = np.arange(8, dtype=np.uint8)  # sub-block j uses bit j of qh
    hi = ((qh[:, None, :] >> shifts[None, :, None]) & 1) << 4
    q = (lo + hi).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(-1)


def _deq_q6_k(raw, nb):
    b = _blocks(raw, nb)
    ql = b[:, 0:128].reshape(-1, 2, 64)  # two halves of 128 elements
    qh = b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).reshape(-1, 2, 8).astype(np.float32)
    d = _f16(b, 208)[:, :, None]  # [n, 1, 1]
    q1 = (ql[:, :, 0:32] & 0xF) | (((qh >> 0) & 3) << 4)
    q2 = (ql[:, :, 32:64] & 0xF) | (((qh >> 2) & 3) << 4)
    q3 = (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
    q4 = (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
    q = np.stack([q1, q2, q3, q4], axis=2).astype(np.int32) - 32  # [n, 2, 4, 32]
    # element l of quarter k in half h uses scale sc[h, 2k + l // 16]
    s = sc.reshape(-1, 2, 4, 2)[:, :, :, :, None]  # [n, 2, 4, 2, 1]
    qq = q.reshape(-1, 2, 4, 2, 16).astype(np.float32)
    return ((d[:, :, :, None, None] * s) * qq).reshape(-1)


_DEQUANT = {0: _deq_f32, 1: _deq_f16, 30: _deq_bf16, 2: _deq_q4_0, 3: _deq_q4_1, 6: _deq_q5_0,
            7: _deq_q5_1, 8: _deq_q8_0, 12: _deq_q4_k, 13: _deq_q5_k, 14: _deq_q6_k}
