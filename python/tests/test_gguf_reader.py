"""examples/gguf_reader.py: the NumPy dequantization against a scalar transcription
of model/gguf/src/quant.cpp (float32 operations in the same order), and the
reader's refusal of truncated files. Skipped without NumPy.

The test models of tests/models cover F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and
Q6_K end to end (numpy_llama reproduces their goldens bit for bit); this covers
the rest (Q5_0, Q5_1, BF16) and pins the block layouts.
"""

import os
import random
import struct
import tempfile
import unittest

try:
    import numpy as np

    from touchstone_engine.examples import gguf_reader as G
except ImportError:  # pragma: no cover
    np = None

f32 = (lambda x: float(np.float32(x))) if np is not None else None


def h(x):
    return struct.pack("<e", x)


def halfval(b):
    return float(np.frombuffer(b, "<f2")[0].astype(np.float32))


def scalar_q5(block, with_min):
    """deq_q5_0 / deq_q5_1 of quant.cpp, element by element."""
    d = halfval(block[0:2])
    m = halfval(block[2:4]) if with_min else 0.0
    o = 4 if with_min else 2
    qh = struct.unpack("<I", block[o:o + 4])[0]
    qs = block[o + 4:o + 20]
    y = [0.0] * 32
    for j in range(16):
        xh0 = ((qh >> j) << 4) & 0x10
        xh1 = (qh >> (j + 12)) & 0x10
        x0 = (qs[j] & 0x0F) | xh0
        x1 = (qs[j] >> 4) | xh1
        if not with_min:
            x0, x1 = x0 - 16, x1 - 16
        y[j] = f32(f32(f32(x0) * d) + m)
        y[j + 16] = f32(f32(f32(x1) * d) + m)
    return y


@unittest.skipIf(np is None, "numpy is not installed")
class Dequantize(unittest.TestCase):
    def setUp(self):
        self.rng = random.Random(14)

    def blocks(self, n, with_min):
        out = b""
        for _ in range(n):
            b = h(self.rng.uniform(-0.1, 0.1))
            if with_min:
                b += h(self.rng.uniform(-0.5, 0.5))
            b += bytes(self.rng.randrange(256) for _ in range(20))
            out += b
        return out

    def test_q5_0(self):
        raw = self.blocks(8, False)
        got = G._deq_q5_0(np.frombuffer(raw, np.uint8), 22)
        want = [v for i in range(8) for v in scalar_q5(raw[22 * i:22 * i + 22], False)]
        np.testing.assert_array_equal(got, np.array(want, np.float32))

    def test_q5_1(self):
        raw = self.blocks(8, True)
        got = G._deq_q5_1(np.frombuffer(raw, np.uint8), 24)
        want = [v for i in range(8) for v in scalar_q5(raw[24 * i:24 * i + 24], True)]
        np.testing.assert_array_equal(got, np.array(want, np.float32))

    def test_q4_1_nibble_order(self):
        raw = h(1.0) + h(-8.0) + bytes(range(0, 256, 16))  # low nibbles 0, high 0..15
        got = G._deq_q4_1(np.frombuffer(raw, np.uint8), 20)
        np.testing.assert_array_equal(got[:16], np.full(16, -8.0, np.float32))
        np.testing.assert_array_equal(got[16:], np.arange(16, dtype=np.float32) - 8.0)

    def test_bf16_and_f16(self):
        vals = np.array([1.5, -2.25, 3.0e38, 1.0e-30], np.float32)
        bf = (vals.view(np.uint32) >> 16).astype("<u2").tobytes()
        np.testing.assert_array_equal(G._deq_bf16(np.frombuffer(bf, np.uint8), 2),
                                      (np.frombuffer(bf, "<u2").astype(np.uint32) << 16)
                                      .view(np.float32))
        f16 = np.array([0.5, -65504.0, 6e-8], "<f2")
        np.testing.assert_array_equal(G._deq_f16(np.frombuffer(f16.tobytes(), np.uint8), 2),
                                      f16.astype(np.float32))


@unittest.skipIf(np is None, "numpy is not installed")
class Files(unittest.TestCase):
    def write(self, data):
        fd, path = tempfile.mkstemp(suffix=".gguf")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        self.addCleanup(os.remove, path)
        return path

    def gguf(self, tensor_bytes=b"\x00" * 16, arch=b"llama", u32_keys=()):
        def s(x):
            return struct.pack("<Q", len(x)) + x
        head = struct.pack("<IIQQ", G.GGUF_MAGIC, 3, 1, 1 + len(u32_keys))
        head += s(b"general.architecture") + struct.pack("<I", 8) + s(arch)
        for key in u32_keys:  # GGUF type 4: uint32
            head += s(key) + struct.pack("<II", 4, 512)
        head += s(b"t.weight") + struct.pack("<I", 1) + struct.pack("<Q", 4)
        head += struct.pack("<IQ", 0, 0)  # F32 at offset 0
        head += b"\x00" * (-len(head) % 32)
        return head + tensor_bytes

    def test_reads_a_small_file(self):
        g = G.GGUFFile(self.write(self.gguf(struct.pack("<4f", 1, 2, 3, 4))))
        self.assertEqual(g.metadata["general.architecture"], "llama")
        np.testing.assert_array_equal(g.dequantize("t.weight"), [1, 2, 3, 4])

    def test_truncated_tensor_is_refused(self):
        with self.assertRaisesRegex(G.GGUFError, "tensor 't.weight' ends at byte"):
            G.GGUFFile(self.write(self.gguf(b"\x00" * 8)))

    def test_truncated_header_names_the_offset(self):
        data = self.gguf()[:40]
        with self.assertRaisesRegex(G.GGUFError, "truncated at offset"):
            G.GGUFFile(self.write(data))

    def test_not_gguf(self):
        with self.assertRaisesRegex(G.GGUFError, "not a GGUF file"):
            G.GGUFFile(self.write(b"PK\x03\x04" + b"\x00" * 60))

    def test_empty_file(self):
        with self.assertRaises(G.GGUFError):
            G.GGUFFile(self.write(b""))

    def test_hf_transformers_refuses_what_its_loader_drops(self):
        # examples/hf_transformers.py declares sliding_window for gemma3, whose GGUF
        # loader maps it; transformers' llama loader ignores the key (no torch needed).
        from touchstone_engine import TS_ERR_IO, TS_ERR_UNSUPPORTED, EngineError
        from touchstone_engine.examples.hf_transformers import refuse_unmapped
        key = b"llama.attention.sliding_window"
        with self.assertRaises(EngineError) as e:
            refuse_unmapped(self.write(self.gguf(u32_keys=[key])))
        self.assertEqual(e.exception.status, TS_ERR_UNSUPPORTED)
        self.assertIn("'llama.attention.sliding_window'", str(e.exception))
        self.assertIsNone(refuse_unmapped(self.write(self.gguf())))
        self.assertIsNone(refuse_unmapped(self.write(
            self.gguf(arch=b"gemma3", u32_keys=[b"gemma3.attention.sliding_window"]))))
        with self.assertRaises(EngineError) as e:
            refuse_unmapped(self.write(b"PK\x03\x04" + b"\x00" * 60))
        self.assertEqual(e.exception.status, TS_ERR_IO)


if __name__ == "__main__":
    unittest.main()
