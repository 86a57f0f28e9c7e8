"""An exec: child serving one of fake_engines' engines (exec_channel_test.cpp).

usage: fake_child.py ENGINE_CLASS   (default FakeEngine)

BatchExtraFloat: ServingEngine whose step_batch replies carry one float more
than the entries' logits (serve() itself never sends that: the harness's size
check is what is tested).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import fake_engines  # noqa: E402
from touchstone_engine import serve  # noqa: E402

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "FakeEngine"
    if name == "BatchExtraFloat":
        from touchstone_engine import protocol as P
        from touchstone_engine import server
        inner = server._HANDLERS[P.STEP_BATCH]
        server._HANDLERS[P.STEP_BATCH] = lambda s, r: inner(s, r) + [b"\0\0\0\0"]
        name = "ServingEngine"
    serve(getattr(fake_engines, name))
