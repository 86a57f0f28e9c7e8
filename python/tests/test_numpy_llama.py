"""examples/numpy_llama.py's ABI v6 calls on the converted llama and gemma3 test
models (tests/models/llama-test-f32.gguf, gemma3-test-f32.gguf): step_batch gives
every entry the logits its own prefill gives, fork copies the KV prefix and leaves
the source alone, and both work through serve()'s request loop. Gemma 3's switches
(layer pattern, per-family key and tensor refusal, NeoX RoPE, tanh GELU, QK-norm)
against scalar transcriptions of reference/transformer. Skipped without NumPy.
"""

import math
import os
import unittest

try:
    import numpy as np

    from touchstone_engine.examples import numpy_llama as NL
except ImportError:  # pragma: no cover
    np = None

from touchstone_engine import BatchEntry, SessionOptions

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "models")
MODEL = os.path.join(MODELS, "llama-test-f32.gguf")
GEMMA3 = os.path.join(MODELS, "gemma3-test-f32.gguf")
PROMPT = [1, 15, 200, 33, 7, 411, 90, 12, 5, 300]


def nmse(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(((a - b) ** 2).sum() / max((b ** 2).sum(), 1e-30))


@unittest.skipIf(np is None, "numpy is not installed")
@unittest.skipUnless(os.path.exists(MODEL), "tests/models/llama-test-f32.gguf is not here")
class NumpyLlamaServing(unittest.TestCase):
    path = MODEL

    @classmethod
    def setUpClass(cls):
        cls.engine = NL.NumpyLlama()
        cls.model = cls.engine.load_model(cls.path)

    def session(self, prefix=()):
        s = self.engine.open_session(self.model, SessionOptions(max_context=64))
        if prefix:
            s.prefill(list(prefix), False)
        return s

    def same(self, got, want, what):
        got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
        self.assertEqual(got.shape, want.shape, what)
        self.assertLessEqual(nmse(got, want), 1e-10, what)
        V = self.model.n_vocab
        for r in range(got.size // V):
            self.assertEqual(int(np.argmax(got[r * V:(r + 1) * V])),
                             int(np.argmax(want[r * V:(r + 1) * V])), f"{what}, row {r}")

    def test_step_batch_equals_each_entrys_prefill(self):
        a, b, c = self.session(PROMPT[:6]), self.session(PROMPT[:2]), self.session(PROMPT[:1])
        entries = [BatchEntry(a, [PROMPT[6]]), BatchEntry(b, PROMPT[2:7]),
                   BatchEntry(c, PROMPT[1:4], True)]
        out = self.engine.step_batch(entries)
        self.assertEqual([s.position() for s in (a, b, c)], [7, 7, 4])
        V = self.model.n_vocab
        self.assertEqual([np.asarray(o).size for o in out], [V, V, 3 * V])
        self.same(out[0], self.session(PROMPT[:6]).prefill([PROMPT[6]], False), "decode entry")
        self.same(out[1], self.session(PROMPT[:2]).prefill(PROMPT[2:7], False), "chunk entry")
        self.same(out[2], self.session(PROMPT[:1]).prefill(PROMPT[1:4], True), "all positions")
        # The caches hold what a prefill writes: the next step agrees too.
        self.same(a.prefill([PROMPT[7]], False),
                  self.session(PROMPT[:7]).prefill([PROMPT[7]], False), "the step after")

    def test_step_batch_records_taps_per_session(self):
        a, b = self.session(PROMPT[:3]), self.session()
        a.set_taps(True)
        self.engine.step_batch([BatchEntry(a, PROMPT[3:5]), BatchEntry(b, PROMPT[:4])])
        ref = self.session(PROMPT[:3])
        ref.set_taps(True)
        ref.prefill(PROMPT[3:5], False)
        self.assertLessEqual(nmse(a.read_taps(), ref.read_taps()), 1e-10)
        self.assertIsNone(b.read_taps())

    def test_fork_copies_the_prefix_and_leaves_the_source(self):
        src = self.session(PROMPT[:8])
        f = self.engine.fork(src, 5)
        self.assertEqual((f.position(), src.position()), (5, 8))
        np.testing.assert_array_equal(f.k_cache[:, :5], src.k_cache[:, :5])
        self.same(f.prefill(PROMPT[8:10], False),
                  self.session(PROMPT[:5]).prefill(PROMPT[8:10], False), "fork at 5")
        self.same(src.prefill(PROMPT[8:10], False),
                  self.session(PROMPT[:8]).prefill(PROMPT[8:10], False), "source after the fork")
        self.assertEqual(self.engine.fork(src, 0).position(), 0)


@unittest.skipIf(np is None, "numpy is not installed")
@unittest.skipUnless(os.path.exists(GEMMA3), "tests/models/gemma3-test-f32.gguf is not here")
class Gemma3Serving(NumpyLlamaServing):
    """The same calls on Gemma 3 (sliding window 8: the 10-token prompt leaves it)."""
    path = GEMMA3


def rope_neox_scalar(v, pos, base, scale):
    """ops::rope_neox of one head, element by element."""
    out, half = list(v), len(v) // 2
    for i in range(half):
        theta = pos / scale * math.pow(base, -2.0 * i / len(v))
        c, s = math.cos(theta), math.sin(theta)
        x0, x1 = float(v[i]), float(v[i + half])
        out[i], out[i + half] = x0 * c - x1 * s, x0 * s + x1 * c
    return np.asarray(out, np.float32)


@unittest.skipIf(np is None, "numpy is not installed")
@unittest.skipUnless(os.path.exists(GEMMA3), "tests/models/gemma3-test-f32.gguf is not here")
class Gemma3Config(unittest.TestCase):
    def gguf(self, path=GEMMA3, **extra):
        g = NL.GGUFFile(path)
        g.metadata.update(extra)
        return g

    def refused(self, g, name):
        with self.assertRaises(NL.EngineError) as e:
            NL.Config(g)
        self.assertEqual(e.exception.status, NL.TS_ERR_UNSUPPORTED)
        self.assertIn(name, str(e.exception))

    def test_layer_pattern_and_switches(self):
        c = NL.Config(self.gguf())
        local, glob = NL.LayerConfig(10000.0, 1.0, 8), NL.LayerConfig(1e6, 8.0, 0)
        self.assertEqual(c.layers, [local] * 5 + [glob, local])  # 7 layers, l % 6 == 5 global
        self.assertTrue(c.neox_rope and c.qk_norm and c.post_norms and c.gelu)
        self.assertEqual((c.embd_scale, c.attn_scale, c.softcap), (8.0, 1 / math.sqrt(32), 0.0))
        self.assertIn("blk.6.post_ffw_norm.weight", c.expected_tensors())
        self.assertNotIn("rope_freqs.weight", c.expected_tensors())

    def test_gemma3_keys_read_and_unknown_keys_refused(self):
        c = NL.Config(self.gguf(**{"gemma3.rope.freq_base_swa": 5000.0,
                                   "gemma3.final_logit_softcapping": 30.0}))
        self.assertEqual((c.layers[0].rope_base, c.softcap), (5000.0, 30.0))
        self.refused(self.gguf(**{"gemma3.attention.scale": 0.5}), "'gemma3.attention.scale'")
        # Gemma 3's own keys are unknown to llama
        self.refused(self.gguf(MODEL, **{"llama.final_logit_softcapping": 30.0}),
                     "'llama.final_logit_softcapping'")

    def test_softcap_applied_to_the_logits(self):
        engine = NL.NumpyLlama()
        m = engine.load_model(GEMMA3)
        plain = engine.open_session(m, SessionOptions(max_context=16)).prefill(PROMPT[:3], True)
        m.c.softcap = 2.0
        capped = engine.open_session(m, SessionOptions(max_context=16)).prefill(PROMPT[:3], True)
        want = (2.0 * np.tanh(np.asarray(plain, np.float64) / 2.0)).astype(np.float32)
        np.testing.assert_array_equal(capped, want)

    def test_neox_rope_and_gelu_match_the_scalar_ops(self):
        c = NL.Config(self.gguf())
        rng = np.random.default_rng(1)
        x = rng.standard_normal((3, c.n_head * c.head_dim)).astype(np.float32)
        pos = np.array([0, 5, 200])
        half = np.arange(c.head_dim // 2, dtype=np.float64)
        inv_freq = np.power(1e6, -2.0 * half / c.head_dim)
        got = NL.rope(c, x, pos, inv_freq, 8.0)
        for r in range(3):
            for h in range(c.n_head):
                sl = slice(h * c.head_dim, (h + 1) * c.head_dim)
                np.testing.assert_allclose(got[r, sl], rope_neox_scalar(x[r, sl], pos[r], 1e6, 8.0),
                                           rtol=0, atol=1e-6)
        g = np.array([-8.0, -1.5, 0.0, 0.3, 4.0])
        k = math.sqrt(2.0 / math.pi)
        want = [0.5 * v * (1.0 + math.tanh(k * (v + 0.044715 * v ** 3))) for v in g]
        np.testing.assert_allclose(NL.gelu_tanh(g), want, rtol=1e-15, atol=1e-300)

    def test_query_blocks_read_only_their_window(self):
        """Blocks of 4 queries under a window of 8 (later blocks skip the oldest keys)
        give the logits of one block of every query."""
        engine = NL.NumpyLlama()
        m = engine.load_model(GEMMA3)
        tokens = [(7 * i + 3) % m.n_vocab for i in range(40)]
        whole = engine.open_session(m, SessionOptions(max_context=64)).prefill(tokens, True)
        old, NL.QUERY_BLOCK = NL.QUERY_BLOCK, 4
        try:
            blocks = engine.open_session(m, SessionOptions(max_context=64)).prefill(tokens, True)
        finally:
            NL.QUERY_BLOCK = old
        self.assertLessEqual(nmse(blocks, whole), 1e-12)

    def test_qk_norm_is_per_head(self):
        x = np.arange(1, 9, dtype=np.float32).reshape(1, 8)  # two heads of 4
        w = np.array([1.0, 2.0, 1.0, 0.5], np.float32)
        got = NL.head_norm(x, w, 1e-6)
        for h in range(2):
            v = x[0, 4 * h:4 * h + 4].astype(np.float64)
            want = v / math.sqrt((v * v).mean() + 1e-6) * w
            np.testing.assert_allclose(got[0, 4 * h:4 * h + 4], want, rtol=1e-6)


if __name__ == "__main__":
    unittest.main()
