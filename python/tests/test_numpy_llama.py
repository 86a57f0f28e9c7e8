"""examples/numpy_llama.py's ABI v6 calls on the converted llama test model
(tests/models/llama-test-f32.gguf): step_batch gives every entry the logits its
own prefill gives, fork copies the KV prefix and leaves the source alone, and
both work through serve()'s request loop. Skipped without NumPy.
"""

import os
import unittest

try:
    import numpy as np

    from touchstone_engine.examples import numpy_llama as NL
except ImportError:  # pragma: no cover
    np = None

from touchstone_engine import BatchEntry, SessionOptions

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "models",
                     "llama-test-f32.gguf")
PROMPT = [1, 15, 200, 33, 7, 411, 90, 12, 5, 300]


def nmse(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(((a - b) ** 2).sum() / max((b ** 2).sum(), 1e-30))


@unittest.skipIf(np is None, "numpy is not installed")
@unittest.skipUnless(os.path.exists(MODEL), "tests/models/llama-test-f32.gguf is not here")
class NumpyLlamaServing(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.engine = NL.NumpyLlama()
        cls.model = cls.engine.load_model(MODEL)

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


if __name__ == "__main__":
    unittest.main()
