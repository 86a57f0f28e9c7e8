"""serve()'s request loop against fake engines, over a real socketpair.

Checks what the harness relies on: the hello reply, the shared argument checks
(touchstone/abi/backend_adapter.hpp: token ids, room, rewind range, weight path,
faults), the mapping of Python exceptions to ts_status + message, the sizes of
what an engine returns, and a clean exit on EOF.
"""

import os
import socket
import struct
import subprocess
import sys
import threading
import unittest
from array import array

import fake_engines as F
from touchstone_engine import protocol as P
from touchstone_engine.server import Server, f32_bytes, run

HERE = os.path.dirname(os.path.abspath(__file__))


class Harness:
    """The harness's end of the socket, speaking to a Server in a thread."""

    def __init__(self, engine):
        self.sock, self.child = socket.socketpair()
        self.server = Server(engine, self.child, "fake command line")
        self.exit = []
        self.thread = threading.Thread(target=lambda: self.exit.append(self.server.run()))
        self.thread.daemon = True
        self.thread.start()

    def call(self, op, payload=b""):
        self.sock.sendall(P.frame(op, payload))
        header = self._recv(16)
        rop, n = P.parse_header(header, 1 << 30)
        assert rop == op | P.REPLY_BIT, (rop, op)
        return P.Reader(self._recv(n), f"{P.op_name(op)} reply")

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def close(self):
        self.sock.close()
        self.thread.join(10)
        self.child.close()
        return self.exit


def hello(h):
    r = h.call(P.HELLO, P.Writer().u32(P.VERSION).bytes())
    assert r.i32("status") == P.TS_OK
    return P.BackendInfo.decode(r)


def status(r):
    s = r.i32("status")
    return (s, r.str("error")) if s != P.TS_OK else (s, None)


class ServerTest(unittest.TestCase):
    engine = F.FakeEngine

    def setUp(self):
        self.h = Harness(self.engine)
        self.info = hello(self.h)

    def tearDown(self):
        self.assertEqual(self.h.close(), [0])  # EOF: a clean exit

    def load(self, path="model.gguf"):
        r = self.h.call(P.LOAD_MODEL, P.Writer().str(path).bytes())
        self.assertEqual(r.i32("status"), P.TS_OK)
        return r.u64("model"), r.i32("n_vocab")

    def open(self, model, weight_path=0, n_threads=0, max_context=0, fault=""):
        w = P.Writer().u64(model).i32(weight_path).i32(n_threads).i32(max_context).str(fault)
        return self.h.call(P.OPEN_SESSION, w.bytes())

    def session(self, **kw):
        m, _ = self.load()
        r = self.open(m, **kw)
        self.assertEqual(r.i32("status"), P.TS_OK)
        return r.u64("session")

    def prefill(self, s, tokens, all_positions=False):
        w = P.Writer().u64(s).i32(1 if all_positions else 0).i32(len(tokens)).i32s(tokens)
        return self.h.call(P.PREFILL, w.bytes())


class Hello(ServerTest):
    def test_identity(self):
        i = self.info
        self.assertEqual((i.protocol_version, i.api_version), (P.VERSION, P.API_VERSION))
        self.assertFalse(i.step_batch)
        self.assertFalse(i.fork)
        self.assertFalse(i.grammar)  # a Python engine enforces no grammar (ABI v7)
        self.assertEqual((i.name, i.version, i.path, i.device), ("fake", "1.2.3",
                                                                 "fake command line", "fake device"))
        self.assertTrue(i.declares_models)
        self.assertEqual((i.architectures, i.model_features), ("llama", ""))
        self.assertFalse(i.device_greedy)
        self.assertFalse(i.taps)

    def test_capabilities(self):
        r = self.h.call(P.CAPABILITIES)
        self.assertEqual(r.i32("status"), P.TS_OK)
        c = P.Capabilities.decode(r)
        r.finish()
        self.assertEqual((c.flags, c.max_context, c.shape_buckets), (1, 32, [4]))


class Calls(ServerTest):
    def test_prefill_decode_position_rewind(self):
        s = self.session()
        r = self.prefill(s, [3, 4])
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertEqual(r.f32s("logits", F.N_VOCAB), [x for x in map(lambda v: struct.unpack(
            "<f", struct.pack("<f", v))[0], F.row(4, 1))])
        r.finish()
        r = self.prefill(s, [1, 2], all_positions=True)
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertEqual(r.remaining(), 4 * 2 * F.N_VOCAB)
        r = self.h.call(P.DECODE, P.Writer().u64(s).i32(5).bytes())
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertAlmostEqual(r.f32s("l", 1)[0], 9.0)  # token 5 at position 4
        r = self.h.call(P.POSITION, P.Writer().u64(s).bytes())
        self.assertEqual((r.i32("status"), r.i32("position")), (P.TS_OK, 5))
        r = self.h.call(P.REWIND, P.Writer().u64(s).i32(2).bytes())
        self.assertEqual(status(r), (P.TS_OK, None))
        r = self.h.call(P.POSITION, P.Writer().u64(s).bytes())
        self.assertEqual((r.i32("status"), r.i32("position")), (P.TS_OK, 2))

    def test_nested_list_logits(self):
        m, _ = self.load("model.list")
        r = self.open(m)
        r.i32("status")
        s = r.u64("session")
        r = self.prefill(s, [1, 2, 3], all_positions=True)
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertEqual(r.remaining(), 4 * 3 * F.N_VOCAB)

    def test_free_session_and_model(self):
        m, _ = self.load()
        r = self.open(m)
        r.i32("status")
        s = r.u64("session")
        session = self.h.server.sessions[s][0]
        self.assertEqual(status(self.h.call(P.FREE_SESSION, P.Writer().u64(s).bytes())),
                         (P.TS_OK, None))
        self.assertTrue(session.closed)
        self.assertEqual(status(self.h.call(P.FREE_MODEL, P.Writer().u64(m).bytes())),
                         (P.TS_OK, None))
        self.assertEqual(self.h.server.models, {})


class Checks(ServerTest):
    """The shared checks, with the adapter's status and words."""

    def test_token_out_of_range(self):
        s = self.session()
        self.assertEqual(status(self.prefill(s, [1, 8])),
                         (P.TS_ERR_INVALID_ARGUMENT, "token #1 = 8 outside [0, 8)"))
        self.assertEqual(status(self.prefill(s, [-1])),
                         (P.TS_ERR_INVALID_ARGUMENT, "token #0 = -1 outside [0, 8)"))
        r = self.h.call(P.DECODE, P.Writer().u64(s).i32(99).bytes())
        self.assertEqual(status(r), (P.TS_ERR_INVALID_ARGUMENT, "token #0 = 99 outside [0, 8)"))
        # a refused call does not advance
        r = self.h.call(P.POSITION, P.Writer().u64(s).bytes())
        self.assertEqual((r.i32("status"), r.i32("position")), (P.TS_OK, 0))

    def test_empty_prefill(self):
        s = self.session()
        self.assertEqual(status(self.prefill(s, [])),
                         (P.TS_ERR_INVALID_ARGUMENT, "prefill: null buffer or n_tokens <= 0"))

    def test_context_full(self):
        s = self.session(max_context=4)
        self.assertEqual(status(self.prefill(s, [1, 2, 3]))[0], P.TS_OK)
        self.assertEqual(status(self.prefill(s, [1, 2])),
                         (P.TS_ERR_CONTEXT_FULL, "position 3 + 2 tokens exceeds max context 4"))

    def test_rewind_range(self):
        s = self.session()
        self.prefill(s, [1, 2])
        for p in (-1, 3):
            r = self.h.call(P.REWIND, P.Writer().u64(s).i32(p).bytes())
            self.assertEqual(status(r), (P.TS_ERR_INVALID_ARGUMENT, f"rewind to {p} outside [0, 2]"))

    def test_session_options(self):
        m, _ = self.load()
        self.assertEqual(status(self.open(m, weight_path=7)),
                         (P.TS_ERR_INVALID_ARGUMENT, "open_session: unknown weight path"))
        self.assertEqual(status(self.open(m, n_threads=-1)), (
            P.TS_ERR_INVALID_ARGUMENT, "open_session: negative n_threads or max_context"))
        self.assertEqual(status(self.open(m, fault="nope")),
                         (P.TS_ERR_UNSUPPORTED, "unknown fault 'nope' (known: known_fault)"))
        self.assertEqual(status(self.open(m, fault="known_fault"))[0], P.TS_OK)

    def test_unknown_handles(self):
        self.assertEqual(status(self.prefill(77, [1])),
                         (P.TS_ERR_INTERNAL, "unknown session handle 77"))
        self.assertEqual(status(self.open(5)), (P.TS_ERR_INTERNAL, "unknown model handle 5"))

    def test_malformed_requests(self):
        s = self.session()
        r = self.h.call(P.PREFILL, P.Writer().u64(s).i32(0).i32(3).i32s([1]).bytes())
        self.assertEqual(status(r), (P.TS_ERR_INTERNAL, "prefill: n_tokens 3 does not match the "
                                     "4 bytes of tokens"))
        r = self.h.call(P.POSITION, P.Writer().u64(s).u32(0).bytes())
        self.assertEqual(status(r), (P.TS_ERR_INVALID_ARGUMENT, "position request: 4 unexpected "
                                     "trailing bytes at offset 8"))
        r = self.h.call(P.DECODE, b"\x01")
        self.assertEqual(status(r)[0], P.TS_ERR_INVALID_ARGUMENT)
        r = self.h.call(99)
        self.assertEqual(status(r), (P.TS_ERR_INTERNAL, "unexpected op 99"))

    def test_no_greedy_no_taps(self):
        s = self.session()
        r = self.h.call(P.PREFILL_GREEDY, P.Writer().u64(s).i32(1).i32s([1]).bytes())
        self.assertEqual(status(r), (P.TS_ERR_INTERNAL,
                                     "backend has no device greedy (TS_CAP_DEVICE_GREEDY)"))
        r = self.h.call(P.SET_TAPS, P.Writer().u64(s).i32(1).bytes())
        self.assertEqual(status(r), (P.TS_ERR_INTERNAL, "backend has no layer taps (ABI v4)"))


class Errors(ServerTest):
    """Python exceptions -> ts_status + message."""

    def load_status(self, path):
        return status(self.h.call(P.LOAD_MODEL, P.Writer().str(path).bytes()))

    def test_engine_error_keeps_its_status(self):
        self.assertEqual(self.load_status("x.missing"), (P.TS_ERR_IO, "x.missing: no such file"))
        self.assertEqual(self.load_status("x.qwen"),
                         (P.TS_ERR_UNSUPPORTED, "architecture 'qwen2' is not supported"))

    def test_other_exception_is_internal_with_the_last_line(self):
        s, msg = self.load_status("x.boom")
        self.assertEqual(s, P.TS_ERR_INTERNAL)
        self.assertRegex(msg, r"^ValueError: deliberate failure in load_model "
                              r"\(fake_engines\.py:\d+ in load_model\)$")

    def test_memory_error(self):
        self.assertEqual(self.load_status("x.oom"), (P.TS_ERR_OUT_OF_MEMORY, "out of memory"))

    def test_bad_n_vocab(self):
        self.assertEqual(self.load_status("x.zero_vocab"),
                         (P.TS_ERR_INTERNAL, "load_model: n_vocab is 0, must be in [1, 2^31)"))


class GreedyAndTaps(ServerTest):
    engine = F.GreedyTapsEngine

    def test_hello_declares_them(self):
        self.assertTrue(self.info.device_greedy)
        self.assertTrue(self.info.taps)
        r = self.h.call(P.CAPABILITIES)
        r.i32("status")
        self.assertTrue(P.Capabilities.decode(r).flags & P.TS_CAP_DEVICE_GREEDY)

    def test_prefill_greedy(self):
        s = self.session()
        r = self.h.call(P.PREFILL_GREEDY, P.Writer().u64(s).i32(2).i32s([1, 2]).bytes())
        self.assertEqual((r.i32("status"), r.i32("token")), (P.TS_OK, F.N_VOCAB - 1))
        r = self.h.call(P.PREFILL_GREEDY, P.Writer().u64(s).i32(1).i32s([9]).bytes())
        self.assertEqual(status(r), (P.TS_ERR_INVALID_ARGUMENT, "token #0 = 9 outside [0, 8)"))

    def test_taps(self):
        s = self.session()
        read = P.Writer().u64(s).u64(6).bytes()
        self.assertEqual(status(self.h.call(P.READ_TAPS, read)), (
            P.TS_ERR_INVALID_ARGUMENT, "read_taps: nothing recorded (set_taps(1) first, then a call)"))
        self.h.call(P.SET_TAPS, P.Writer().u64(s).i32(1).bytes())
        self.prefill(s, [1, 2])
        r = self.h.call(P.READ_TAPS, P.Writer().u64(s).u64(5).bytes())
        self.assertEqual(status(r), (P.TS_ERR_INVALID_ARGUMENT,
                                     "read_taps: n_floats 5 != n_layer x 3 x n_embd = 6"))
        r = self.h.call(P.READ_TAPS, read)
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertEqual(r.f32s("taps", 6), [2.0] * 6)
        r = self.h.call(P.READ_TAPS, P.Writer().u64(s).u64(0).bytes())
        self.assertEqual(status(r), (P.TS_ERR_INTERNAL, "read_taps: n_floats 0 outside [1, 2^28]"))


def f32(values):
    return list(array("f", values))


class Embeddings(ServerTest):
    """ABI v8 PREFILL_EMBEDDINGS: declared at hello, checked as the C++ adapter checks."""
    engine = F.EmbeddingEngine

    def call(self, s, rows, n_embd=2, bidirectional=False, all_positions=True):
        flat = [x for r in rows for x in r]
        w = P.Writer().u64(s).i32(1 if all_positions else 0).i32(len(rows)).i32(n_embd)
        w.i32(1 if bidirectional else 0).raw(struct.pack(f"<{len(flat)}f", *flat))
        return self.h.call(P.PREFILL_EMBEDDINGS, w.bytes())

    def test_hello_and_capabilities(self):
        self.assertTrue(self.info.embeddings)
        self.assertFalse(self.info.vision)
        r = self.h.call(P.CAPABILITIES)
        r.i32("status")
        flags = P.Capabilities.decode(r).flags
        self.assertTrue(flags & P.TS_CAP_EMBEDDING_INPUT)
        self.assertFalse(flags & P.TS_CAP_MULTIMODAL)

    def test_rows_reach_the_session(self):
        s = self.session()
        r = self.call(s, [[1.0, 2.0], [0.5, 0.5]])
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertEqual(r.f32s("logits", 2 * F.N_VOCAB), f32(F.row(3, 0) + F.row(1, 1)))
        r = self.call(s, [[1.0, 1.0]], bidirectional=True, all_positions=False)
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertEqual(r.f32s("logits", F.N_VOCAB), f32(F.row(102, 2)))
        r = self.h.call(P.POSITION, P.Writer().u64(s).bytes())
        self.assertEqual((r.i32("status"), r.i32("position")), (P.TS_OK, 3))

    def test_checks(self):
        s = self.session(max_context=2)
        self.assertEqual(status(self.call(s, [[1.0, 2.0, 3.0]], n_embd=3)), (
            P.TS_ERR_INVALID_ARGUMENT,
            "prefill_embeddings: n_embd 3 is not the model's embedding width 2"))
        self.assertEqual(status(self.call(s, [[1.0, 2.0]] * 3)), (
            P.TS_ERR_CONTEXT_FULL, "position 0 + 3 tokens exceeds max context 2"))
        w = P.Writer().u64(s).i32(0).i32(2).i32(2).i32(0).raw(struct.pack("<3f", 1, 2, 3))
        self.assertEqual(status(self.h.call(P.PREFILL_EMBEDDINGS, w.bytes())), (
            P.TS_ERR_INVALID_ARGUMENT,
            "prefill_embeddings: 2 x 2 floats do not match the 12 bytes sent"))


class NoEmbeddings(ServerTest):
    def test_refused_and_not_declared(self):
        self.assertFalse(self.info.embeddings)
        s = self.session()
        w = P.Writer().u64(s).i32(0).i32(1).i32(2).i32(0).raw(struct.pack("<2f", 1, 2))
        self.assertEqual(status(self.h.call(P.PREFILL_EMBEDDINGS, w.bytes()))[0],
                         P.TS_ERR_UNSUPPORTED)


def batch(entries):
    return P.encode_step_batch(P.Writer(), entries).bytes()


class Serving(ServerTest):
    engine = F.ServingEngine

    def open2(self):
        """Two sessions of one model."""
        m, _ = self.load()
        out = []
        for _ in range(2):
            r = self.open(m)
            self.assertEqual(r.i32("status"), P.TS_OK)
            out.append(r.u64("session"))
        return out

    def position(self, s):
        r = self.h.call(P.POSITION, P.Writer().u64(s).bytes())
        self.assertEqual(r.i32("status"), P.TS_OK)
        return r.i32("position")

    def test_hello_and_capabilities(self):
        self.assertTrue(self.info.step_batch)
        self.assertTrue(self.info.fork)
        r = self.h.call(P.CAPABILITIES)
        self.assertEqual(r.i32("status"), P.TS_OK)
        c = P.Capabilities.decode(r)
        self.assertEqual(c.max_batch, 3)
        self.assertTrue(c.flags & P.TS_CAP_KV_PREFIX_COPY)  # set because fork exists

    def test_each_entry_gets_its_prefill(self):
        a, b = self.open2()
        self.prefill(a, [1, 2])
        r = self.h.call(P.STEP_BATCH, batch([(a, [3], False), (b, [4, 5], True)]))
        self.assertEqual(r.i32("status"), P.TS_OK)
        got = r.f32s("logits", 3 * F.N_VOCAB)
        r.finish()
        want = F.row(3, 2) + F.row(4, 0) + F.row(5, 1)
        self.assertEqual(got, [float(F.array("f", [x])[0]) for x in want])
        self.assertEqual((self.position(a), self.position(b)), (3, 2))

    def test_errors_name_the_entry_and_move_nothing(self):
        a, b = self.open2()
        self.prefill(a, [1, 2])
        other = self.session()
        cases = [
            ([(a, [1], False), (b, [1, F.N_VOCAB], False)], P.TS_ERR_INVALID_ARGUMENT,
             "step_batch: entry 1: token #1 = 8 outside"),
            ([(a, [1], False), (a, [1], False)], P.TS_ERR_INVALID_ARGUMENT,
             "entry 1: the same session twice"),
            ([(a, [1], False), (other, [1], False)], P.TS_ERR_INVALID_ARGUMENT,
             "entry 1: a session of another model"),
            ([(a, [1], False), (b, [1] * 33, False)], P.TS_ERR_CONTEXT_FULL,
             "entry 1: position 0 \\+ 33 tokens exceeds"),
            ([(a, [1], False)] * 4, P.TS_ERR_INVALID_ARGUMENT, "4 entries, max_batch is 3"),
            ([(a, [1], False), (999, [1], False)], P.TS_ERR_INTERNAL,
             "entry 1: unknown session handle 999"),
        ]
        for entries, want, message in cases:
            st, msg = status(self.h.call(P.STEP_BATCH, batch(entries)))
            self.assertEqual(st, want, msg)
            self.assertRegex(msg, message)
            self.assertEqual((self.position(a), self.position(b)), (2, 0))

    def test_a_failing_engine_rolls_back(self):
        a, b = self.open2()
        self.prefill(a, [1, 2])
        self.h.server.engine.fail_batch = True
        st, msg = status(self.h.call(P.STEP_BATCH, batch([(a, [3], False), (b, [4], False)])))
        self.assertEqual(st, P.TS_ERR_INTERNAL)
        self.assertIn("device lost mid-batch", msg)
        self.assertEqual((self.position(a), self.position(b)), (2, 0))
        self.h.server.engine.fail_batch = False
        self.h.server.engine.short_entry = True
        st, msg = status(self.h.call(P.STEP_BATCH, batch([(a, [3], False), (b, [4], False)])))
        self.assertEqual(st, P.TS_ERR_INTERNAL)
        self.assertIn("step_batch (entry 1) returned 7 floats, expected 8", msg)
        self.assertEqual((self.position(a), self.position(b)), (2, 0))

    def test_malformed_request(self):
        st, msg = status(self.h.call(P.STEP_BATCH, struct.pack("<I", 1 << 30)))
        self.assertEqual(st, P.TS_ERR_INVALID_ARGUMENT)
        self.assertIn("n_entries 1073741824", msg)

    def test_fork(self):
        a = self.session()
        self.prefill(a, [1, 2, 3])
        r = self.h.call(P.FORK_SESSION, P.Writer().u64(a).i32(2).bytes())
        self.assertEqual(r.i32("status"), P.TS_OK)
        f = r.u64("session")
        self.assertEqual((self.position(f), self.position(a)), (2, 3))
        r = self.prefill(f, [5])
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertEqual(r.f32s("logits", F.N_VOCAB)[0], 7.0)  # token 5 at position 2
        for n in (-1, 4):
            st, msg = status(self.h.call(P.FORK_SESSION, P.Writer().u64(a).i32(n).bytes()))
            self.assertEqual(st, P.TS_ERR_INVALID_ARGUMENT)
            self.assertIn(f"n_prefix {n} outside [0, 3]", msg)
        # the fork joins a batch with its source
        r = self.h.call(P.STEP_BATCH, batch([(a, [1], False), (f, [1], False)]))
        self.assertEqual(r.i32("status"), P.TS_OK)


class NoServing(ServerTest):
    engine = F.ClaimsServingEngine

    def test_defaults_are_unsupported_and_flags_cleared(self):
        self.assertFalse(self.info.step_batch)
        self.assertFalse(self.info.fork)
        r = self.h.call(P.CAPABILITIES)
        self.assertEqual(r.i32("status"), P.TS_OK)
        c = P.Capabilities.decode(r)
        self.assertEqual(c.flags & (P.TS_CAP_BATCHED_SESSIONS | P.TS_CAP_KV_PREFIX_COPY), 0)
        s = self.session()
        st, msg = status(self.h.call(P.STEP_BATCH, batch([(s, [1], False)])))
        self.assertEqual(st, P.TS_ERR_UNSUPPORTED)
        self.assertIn("no step_batch", msg)
        st, msg = status(self.h.call(P.FORK_SESSION, P.Writer().u64(s).i32(0).bytes()))
        self.assertEqual(st, P.TS_ERR_UNSUPPORTED)
        self.assertIn("no fork_session", msg)


class OlderHarness(unittest.TestCase):
    """A protocol-3 harness gets version 3, ABI 5 and the fields it knows."""

    def test_hello_and_capabilities_of_version_3(self):
        h = Harness(F.ServingEngine)
        r = h.call(P.HELLO, P.Writer().u32(3).bytes())
        self.assertEqual(r.i32("status"), P.TS_OK)
        info = P.BackendInfo.decode(r)
        r.finish()
        self.assertEqual((info.protocol_version, info.api_version), (3, 5))
        self.assertFalse(info.fork)
        r = h.call(P.CAPABILITIES)
        self.assertEqual(r.i32("status"), P.TS_OK)
        c = P.Capabilities.decode(r, 3)
        r.finish()  # nothing after top_n
        self.assertEqual(c.flags & P.TS_CAP_V6_FLAGS, 0)
        self.assertEqual(h.close(), [0])


class WrongSizes(ServerTest):
    engine = F.WrongSizeEngine

    def test_wrong_number_of_logits_is_an_error_not_a_short_reply(self):
        s = self.session()
        self.assertEqual(status(self.prefill(s, [1])), (
            P.TS_ERR_INTERNAL, "prefill returned 3 floats, expected 8 (n_vocab x positions)"))


class NoAdvance(ServerTest):
    engine = F.NoAdvanceEngine

    def test_position_must_advance(self):
        s = self.session()
        self.assertEqual(status(self.prefill(s, [1, 2])), (
            P.TS_ERR_INTERNAL, "prefill: position() is 0 after appending 2 tokens at position 0 "
            "(expected 2)"))


class StartFailures(unittest.TestCase):
    def start(self, engine):
        h = Harness(engine)
        r = h.call(P.HELLO, P.Writer().u32(P.VERSION).bytes())
        result = status(r)
        self.assertEqual(h.close(), [0])
        return result

    def test_constructor_failure_is_the_hello_error(self):
        s, msg = self.start(F.FailingEngine)
        self.assertEqual(s, P.TS_ERR_INTERNAL)
        self.assertRegex(msg, "^engine cannot start: RuntimeError: cannot find the accelerator")

    def test_half_taps_refused(self):
        s, msg = self.start(F.HalfTapsEngine)
        self.assertEqual(s, P.TS_ERR_INTERNAL)
        self.assertIn("only one of set_taps and read_taps", msg)


class Conversions(unittest.TestCase):
    def test_f32_bytes(self):
        from array import array
        self.assertEqual(f32_bytes([[1.0], [2.0]], 2, "x"), struct.pack("<2f", 1, 2))
        self.assertEqual(f32_bytes(array("f", [1, 2]), 2, "x"), struct.pack("<2f", 1, 2))
        with self.assertRaisesRegex(Exception, "buffer of format 'd'"):
            f32_bytes(array("d", [1, 2]), 2, "x")
        with self.assertRaisesRegex(Exception, "expected float32 values"):
            f32_bytes(["a"], 1, "x")

    def test_f32_bytes_numpy(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy is not installed")
        a = np.arange(6, dtype=np.float64).reshape(2, 3)
        self.assertEqual(f32_bytes(a, 6, "x"), struct.pack("<6f", *range(6)))
        self.assertEqual(f32_bytes(a.T, 6, "x"), struct.pack("<6f", 0, 3, 1, 4, 2, 5))


class Process(unittest.TestCase):
    def test_not_a_socket(self):
        code = run(F.FakeEngine, fd=os.open(os.devnull, os.O_RDONLY), redirect_stdout=False)
        self.assertEqual(code, 2)

    def test_serve_in_a_child_writes_nothing_to_stdout(self):
        """An engine that prints: after serve() starts, fd 1 and sys.stdout are stderr."""
        parent, child = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
        code = ("import fake_engines as F\n"
                "from touchstone_engine import serve\n"
                "print('before serve', flush=True)\n"
                f"serve(F.ChattyEngine, fd={child.fileno()})\n")
        p = subprocess.Popen([sys.executable, "-c", code], pass_fds=[child.fileno()], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        child.close()
        parent.sendall(P.frame(P.HELLO, P.Writer().u32(P.VERSION).bytes()))
        op, n = P.parse_header(parent.recv(16, socket.MSG_WAITALL), 1 << 20)
        self.assertEqual(op, P.HELLO | P.REPLY_BIT)
        r = P.Reader(parent.recv(n, socket.MSG_WAITALL), "hello reply")
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertEqual(P.BackendInfo.decode(r).device, "chatty device")
        parent.close()  # EOF: the child exits 0
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out, b"before serve\n")
        self.assertIn(b"chatty engine: print()", err)
        self.assertIn(b"chatty engine: os.write(1)", err)


if __name__ == "__main__":
    unittest.main()


class Grammar(Serving):
    """ABI v7 (protocol 5): serve() keeps an engine's grammar in step with the
    session, as the C++ BackendAdapter does (F.CountingGrammar)."""

    engine = F.GrammarEngine

    def set_grammar(self, s, kind=P.TS_GRAMMAR_GBNF, text="count"):
        return status(self.h.call(P.SET_GRAMMAR, P.Writer().u64(s).i32(kind).str(text).bytes()))

    def mask(self, s):
        r = self.h.call(P.GRAMMAR_MASK, P.Writer().u64(s).i32(1).bytes())
        st = r.i32("status")
        if st != P.TS_OK:
            return st, r.str("error")
        word = r.u32("mask")
        r.finish()
        return st, {t for t in range(F.N_VOCAB) if word >> t & 1}

    def picks(self, s, n):
        r = self.h.call(P.GRAMMAR_GREEDY, P.Writer().u64(s).i32(n).bytes())
        st = r.i32("status")
        return (st, r.str("error")) if st != P.TS_OK else (st, r.i32s("tokens", n))

    def decode(self, s, token):
        return status(self.h.call(P.DECODE, P.Writer().u64(s).i32(token).bytes()))

    def test_hello_and_capability_flag(self):
        self.assertTrue(self.info.grammar)
        r = self.h.call(P.CAPABILITIES)
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertTrue(P.Capabilities.decode(r).flags & P.TS_CAP_STRUCTURED_OUTPUT)

    def test_mask_picks_and_a_refused_token_that_moves_nothing(self):
        s = self.session()
        self.prefill(s, [6, 7])
        self.assertEqual(self.set_grammar(s), (P.TS_OK, None))
        self.assertEqual(self.mask(s), (P.TS_OK, {2, 3, 4, 5}))
        self.assertEqual(self.picks(s, 1), (P.TS_OK, [5]))  # the row's argmax is 7: refused
        st, msg = self.decode(s, 7)
        self.assertEqual(st, P.TS_ERR_INVALID_ARGUMENT)
        self.assertIn("token #0 = 7 is not allowed by the grammar at position 2", msg)
        self.assertEqual(self.position(s), 2)
        self.assertEqual(self.mask(s), (P.TS_OK, {2, 3, 4, 5}))
        # All positions: one pick per row, each in the state after its token.
        self.assertEqual(self.prefill(s, [5, 5, 5], True).i32("status"), P.TS_OK)
        self.assertEqual(self.picks(s, 3), (P.TS_OK, [5, 5, 1]))
        self.assertEqual(self.mask(s), (P.TS_OK, {1}))
        self.assertEqual(self.picks(s, 4)[0], P.TS_ERR_INVALID_ARGUMENT)  # 3 rows only

    def test_rewind_and_fork_carry_the_state_and_before_the_start_remove_it(self):
        s = self.session()
        self.prefill(s, [6])
        self.set_grammar(s)
        self.prefill(s, [2, 3])
        r = self.h.call(P.FORK_SESSION, P.Writer().u64(s).i32(2).bytes())
        self.assertEqual(r.i32("status"), P.TS_OK)
        f = r.u64("session")
        self.assertEqual(self.mask(f), (P.TS_OK, {1, 2, 3, 4, 5}))  # one token taken
        self.assertEqual(self.decode(f, 4), (P.TS_OK, None))
        self.assertEqual(self.decode(f, 5), (P.TS_OK, None))
        self.assertEqual(self.mask(f), (P.TS_OK, {1}))
        self.assertEqual(self.mask(s), (P.TS_OK, {1, 2, 3, 4, 5}))  # the source unchanged
        self.h.call(P.REWIND, P.Writer().u64(s).i32(1).bytes())
        self.assertEqual(self.mask(s), (P.TS_OK, {2, 3, 4, 5}))
        self.h.call(P.REWIND, P.Writer().u64(s).i32(0).bytes())
        st, msg = self.mask(s)
        self.assertEqual(st, P.TS_ERR_INVALID_ARGUMENT)
        self.assertIn("no grammar", msg)

    def test_a_refused_batch_entry_moves_no_entry(self):
        a, b = self.open2()
        self.prefill(a, [6])
        self.prefill(b, [6])
        self.set_grammar(b)
        r = self.h.call(P.STEP_BATCH, batch([(a, [2], False), (b, [3, 7], False)]))
        st, msg = status(r)
        self.assertEqual(st, P.TS_ERR_INVALID_ARGUMENT)
        self.assertIn("step_batch: entry 1: prefill: token #1 = 7 is not allowed", msg)
        self.assertEqual((self.position(a), self.position(b)), (1, 1))
        self.assertEqual(self.mask(b), (P.TS_OK, {2, 3, 4, 5}))
        r = self.h.call(P.STEP_BATCH, batch([(a, [2], False), (b, [3, 4], False)]))
        self.assertEqual(r.i32("status"), P.TS_OK)
        self.assertEqual(self.picks(b, 1), (P.TS_OK, [5]))

    def test_errors(self):
        s = self.session()
        self.assertEqual(self.set_grammar(s, P.TS_GRAMMAR_REGEX)[0], P.TS_ERR_UNSUPPORTED)
        self.assertEqual(self.set_grammar(s, 7)[0], P.TS_ERR_INVALID_ARGUMENT)
        self.assertEqual(self.set_grammar(s, text="oops"),
                         (P.TS_ERR_INVALID_ARGUMENT, "fake: grammar 'oops' at byte 0"))
        self.assertEqual(self.picks(s, 1)[0], P.TS_ERR_INVALID_ARGUMENT)  # no grammar
        self.set_grammar(s)
        self.assertEqual(self.picks(s, 1)[0], P.TS_ERR_INVALID_ARGUMENT)  # no call's rows
        r = self.h.call(P.GRAMMAR_MASK, P.Writer().u64(s).i32(2).bytes())
        self.assertEqual(status(r)[0], P.TS_ERR_INVALID_ARGUMENT)  # n_words
