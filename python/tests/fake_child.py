"""An exec: child serving one of fake_engines' engines (exec_channel_test.cpp).

usage: fake_child.py ENGINE_CLASS   (default FakeEngine)
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import fake_engines  # noqa: E402
from touchstone_engine import serve  # noqa: E402

if __name__ == "__main__":
    serve(getattr(fake_engines, sys.argv[1] if len(sys.argv) > 1 else "FakeEngine"))
