"""The codec of touchstone_engine.protocol: frames, fields, bounds checks.

The byte layouts are the C++ codec's (parity/runtime/src/protocol.cpp); the
expected bytes below are written out by hand, not produced by the codec under test.
"""

import os
import re
import struct
import unittest

from touchstone_engine import protocol as P


class Frames(unittest.TestCase):
    def test_frame_layout(self):
        f = P.frame(P.DECODE, b"\x01\x02")
        self.assertEqual(f[:4], b"TSP1")
        self.assertEqual(f, b"TSP1" + struct.pack("<IQ", 8, 2) + b"\x01\x02")

    def test_parse_header_round_trip(self):
        op, n = P.parse_header(P.frame(P.PREFILL | P.REPLY_BIT, b"x" * 40)[:16], 100)
        self.assertEqual((op, n), (P.PREFILL | P.REPLY_BIT, 40))

    def test_wrong_magic_is_refused(self):
        with self.assertRaisesRegex(P.ProtocolError, "magic 0x.*expected 0x31505354"):
            P.parse_header(b"XXXX" + bytes(12), 100)

    def test_oversized_payload_is_refused_before_allocation(self):
        header = struct.pack("<IIQ", P.MAGIC, P.DECODE, 1 << 62)
        with self.assertRaisesRegex(P.ProtocolError, r"decode.*exceeds the limit of 64"):
            P.parse_header(header, 64)

    def test_short_header(self):
        with self.assertRaisesRegex(P.ProtocolError, "15 bytes, expected 16"):
            P.parse_header(bytes(15), 64)

    def test_op_names(self):
        self.assertEqual(P.op_name(P.READ_TAPS | P.REPLY_BIT), "read_taps")
        self.assertEqual(P.op_name(99), "unknown op")


class Fields(unittest.TestCase):
    def test_writer_layout(self):
        b = P.Writer().u32(7).i32(-1).u64(1 << 40).str("hé").i32s([1, -2]).bytes()
        self.assertEqual(b, struct.pack("<IiQ", 7, -1, 1 << 40) + struct.pack("<I", 3) +
                         "hé".encode() + struct.pack("<2i", 1, -2))

    def test_reader_round_trip(self):
        b = P.Writer().u32(7).i32(-5).u64(2**63).str("name").i32s([3, 4, 5]).bytes()
        r = P.Reader(b, "test")
        self.assertEqual(r.u32("a"), 7)
        self.assertEqual(r.i32("b"), -5)
        self.assertEqual(r.u64("c"), 2**63)
        self.assertEqual(r.str("d"), "name")
        self.assertEqual(r.i32s("e", 3), [3, 4, 5])
        r.finish()

    def test_short_field_names_message_field_and_offset(self):
        r = P.Reader(b"\x01\x02", "decode request")
        with self.assertRaisesRegex(P.ProtocolError,
                                    "decode request: field 'session' needs 8 bytes at offset 0, "
                                    "2 left"):
            r.u64("session")

    def test_string_limit(self):
        r = P.Reader(struct.pack("<I", 100) + b"x" * 100, "hello reply")
        with self.assertRaisesRegex(P.ProtocolError, "string 'name' of 100 bytes exceeds"):
            r.str("name", 10)

    def test_trailing_bytes(self):
        r = P.Reader(b"\x00" * 6, "position request")
        r.u32("x")
        with self.assertRaisesRegex(P.ProtocolError, "2 unexpected trailing bytes at offset 4"):
            r.finish()

    def test_non_utf8_string_survives(self):
        b = P.Writer().str(b"bad\xff").bytes()
        s = P.Reader(b, "t").str("s")
        self.assertEqual(s.encode("utf-8", "surrogateescape"), b"bad\xff")

    def test_error_payload(self):
        self.assertEqual(P.error_payload(P.TS_ERR_IO, "no"),
                         struct.pack("<iI", 3, 2) + b"no")


class Records(unittest.TestCase):
    def test_capabilities_layout(self):
        c = P.Capabilities(flags=P.TS_CAP_ALL_POSITION_LOGITS, weight_types=P.weight_type_bit("Q4_1"),
                           max_context=512, shape_buckets=[16, 64], determinism_note="n")
        b = c.encode(P.Writer()).bytes()
        v4 = struct.pack("<IQii2i", 1, 8, 512, 2, 16, 64) + struct.pack("<I", 1) + b"n"
        v5 = v4 + struct.pack("<i", 0)  # ABI v5 appended i32 top_n
        self.assertEqual(b, v5 + struct.pack("<Ii", 0, 0))  # protocol 4: ABI v6's two fields
        self.assertEqual(c.encode(P.Writer(), 3).bytes(), v5)
        d = P.Capabilities.decode(P.Reader(b, "capabilities reply"))
        self.assertEqual((d.flags, d.weight_types, d.max_context, d.shape_buckets,
                          d.determinism_note, d.top_n), (1, 8, 512, [16, 64], "n", 0))
        # A reply that ends before top_n (an older sender) decodes as top_n 0.
        self.assertEqual(P.Capabilities.decode(P.Reader(v4, "capabilities reply")).top_n, 0)
        t = P.Capabilities(flags=P.TS_CAP_TOP_N_LOGPROBS, top_n=64).encode(P.Writer()).bytes()
        self.assertEqual(P.Capabilities.decode(P.Reader(t, "c")).top_n, 64)

    def test_capabilities_batch_fields(self):
        flags = P.TS_CAP_V6_FLAGS | P.TS_CAP_ALL_POSITION_LOGITS
        c = P.Capabilities(flags=flags, batch_invariant_paths=2, max_batch=8)
        d = P.Capabilities.decode(P.Reader(c.encode(P.Writer()).bytes(), "c"))
        self.assertEqual((d.flags, d.batch_invariant_paths, d.max_batch), (flags, 2, 8))
        # Protocol 3, or a reply that ends before them: 0, and the v6 flags dropped.
        old = c.encode(P.Writer(), 3).bytes()
        for version in (3, 4):
            d = P.Capabilities.decode(P.Reader(old, "c"), version)
            self.assertEqual((d.flags, d.batch_invariant_paths, d.max_batch),
                             (P.TS_CAP_ALL_POSITION_LOGITS, 0, 0))
        bad = P.Capabilities(max_batch=-1).encode(P.Writer()).bytes()
        with self.assertRaisesRegex(P.ProtocolError, "max_batch -1"):
            P.Capabilities.decode(P.Reader(bad, "c"))

    def test_step_batch_request(self):
        entries = [(11, [7], False), (22, [1, 2, 3, 4, 5], False), (33, [9, 8, 7], True)]
        b = P.encode_step_batch(P.Writer(), entries).bytes()
        self.assertEqual(len(b), 4 + 3 * 16 + 4 * 9)
        self.assertEqual(P.decode_step_batch(P.Reader(b, "step_batch request")), entries)

    def test_step_batch_request_is_bounded_before_reading(self):
        cases = [
            (struct.pack("<IQiii", 0xFFFFFFFF, 1, 0, 1, 5), "n_entries 4294967295"),
            (struct.pack("<I", 0), "n_entries 0"),
            (struct.pack("<IQiii", 1, 1, 0, 0x7FFFFFFF, 5), "entry 0: n_tokens 2147483647"),
            (struct.pack("<IQiiiQii", 2, 1, 0, 1, 5, 2, 0, -1), "entry 1: n_tokens -1"),
            (struct.pack("<IQiiiI", 1, 1, 0, 1, 5, 0), "trailing"),
        ]
        for data, message in cases:
            with self.assertRaisesRegex(P.ProtocolError, message):
                P.decode_step_batch(P.Reader(data, "step_batch request"))

    def test_negotiation(self):
        self.assertEqual([P.negotiate(v) for v in (2, 3, 4, 5, 6, 7, 8)], [7, 3, 4, 5, 6, 7, 7])
        self.assertEqual(P.API_VERSION_OF[3], 5)

    def test_capabilities_buckets_bounded(self):
        b = struct.pack("<IQii", 0, 0, 0, 17)
        with self.assertRaisesRegex(P.ProtocolError, "n_shape_buckets 17 outside"):
            P.Capabilities.decode(P.Reader(b, "capabilities reply"))
        many = P.Capabilities(shape_buckets=range(20)).encode(P.Writer()).bytes()
        self.assertEqual(P.Capabilities.decode(P.Reader(many, "c")).shape_buckets, list(range(16)))

    def test_backend_info_layout(self):
        i = P.BackendInfo(name="n", version="v", path="p", device="d", device_greedy=True,
                          declares_models=True, architectures="llama", model_features="", taps=True)
        i.fork = True
        b = i.encode(P.Writer()).bytes()
        expect = struct.pack("<II", 7, P.API_VERSION)
        for s in (b"n", b"v", b"p", b"d"):
            expect += struct.pack("<I", len(s)) + s
        expect += struct.pack("<II", 1, 1) + struct.pack("<I", 5) + b"llama" + struct.pack("<I", 0)
        expect += struct.pack("<I", 1)
        # protocol 4: step_batch, fork; protocol 5: grammar; protocol 6: embeddings, vision;
        # protocol 7: preprocess, vision_options
        self.assertEqual(b, expect + struct.pack("<II", 0, 1) + struct.pack("<I", 0)
                         + struct.pack("<II", 0, 0) + struct.pack("<II", 0, 0))
        d = P.BackendInfo.decode(P.Reader(b, "hello reply"))
        self.assertEqual((d.name, d.architectures, d.taps, d.device_greedy), ("n", "llama", True, True))
        self.assertEqual((d.step_batch, d.fork, d.grammar), (False, True, False))
        i.protocol_version = 4
        v4 = i.encode(P.Writer()).bytes()
        self.assertEqual(v4, struct.pack("<I", 4) + expect[4:] + struct.pack("<II", 0, 1))
        i.protocol_version = 3
        old = i.encode(P.Writer()).bytes()
        self.assertEqual(old, struct.pack("<I", 3) + expect[4:])
        r = P.Reader(old, "hello reply")
        d = P.BackendInfo.decode(r)
        r.finish()
        self.assertEqual((d.protocol_version, d.taps, d.fork), (3, True, False))

    def test_backend_info_rejects_unknown_field(self):
        with self.assertRaises(TypeError):
            P.BackendInfo(nmae="x")

    def test_constants_match_the_c_headers(self):
        """Every constant against common/include/touchstone/abi/backend_abi.h and
        parity/runtime/include/touchstone/runtime/protocol.h (when the sources are there)."""
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        abi = os.path.join(root, "common", "include", "touchstone", "abi", "backend_abi.h")
        proto = os.path.join(root, "parity", "runtime", "include", "touchstone", "runtime", "protocol.h")
        if not (os.path.exists(abi) and os.path.exists(proto)):
            self.skipTest("not in a Touchstone source tree")
        with open(abi, encoding="utf-8") as f:
            text = f.read()
        for name, value in re.findall(r"^\s*(TS_(?:OK|ERR_\w+))\s*=\s*(\d+)", text, re.M):
            self.assertEqual(getattr(P, name), int(value), name)
        for name, value in re.findall(r"#define (TS_CAP_\w+) \(1u << (\d+)\)", text):
            self.assertEqual(getattr(P, name), 1 << int(value), name)
        for name, value in re.findall(r"#define (TS_TAP_\w+) (\d+)", text):
            self.assertEqual(getattr(P, name), int(value), name)
        for name, value in re.findall(r"(TS_WEIGHTS_\w+) = (\d+)", text):
            self.assertEqual(getattr(P, name), int(value), name)
        self.assertEqual(P.API_VERSION, int(re.search(r"#define TS_BACKEND_API_VERSION (\d+)",
                                                      text).group(1)))
        with open(proto, encoding="utf-8") as f:
            text = f.read()
        self.assertEqual(P.VERSION, int(re.search(r"kVersion = (\d+);", text).group(1)))
        self.assertEqual(P.MIN_VERSION, int(re.search(r"kMinVersion = (\d+);", text).group(1)))
        self.assertEqual(P.MAX_BATCH_ENTRIES, 1 << 16)
        self.assertIn("kMaxBatchEntries = 1u << 16", text)
        self.assertEqual(P.MAX_REQUEST_PAYLOAD, 64 << 20)
        self.assertIn("kMaxRequestPayload = 64ull << 20", text)
        ops = dict(re.findall(r"k(\w+) = (\d+),?\s*//", text))
        for cname, value in ops.items():
            pyname = re.sub(r"(?<!^)([A-Z])", r"_\1", cname).upper()
            self.assertEqual(getattr(P, pyname), int(value), cname)
        self.assertGreaterEqual(len(ops), 15)


if __name__ == "__main__":
    unittest.main()
