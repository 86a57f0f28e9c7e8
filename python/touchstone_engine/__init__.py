"""touchstone_engine: write a Touchstone backend in Python.

The harness runs the engine as a child process and talks to it over the
child-process protocol (docs/protocol.md) on fd 3:

    touchstone parity --backend "exec:python3 -m my_engine" --manifest goldens/manifest.json

See docs/python-engines.md and python/README.md.
"""

from . import protocol
from .engine import BatchEntry, Capabilities, Engine, EngineError, Session, SessionOptions
from .protocol import (TS_CAP_ALL_POSITION_LOGITS, TS_CAP_BATCH_INVARIANT,
                       TS_CAP_BATCHED_SESSIONS, TS_CAP_BITWISE_DETERMINISM,
                       TS_CAP_BITWISE_NOT_ACROSS_FORKS,
                       TS_CAP_DEVICE_GREEDY, TS_CAP_KV_PREFIX_COPY, TS_CAP_STATIC_SHAPES,
                       TS_ERR_CONTEXT_FULL, TS_ERR_DEVICE, TS_ERR_INTERNAL,
                       TS_ERR_INVALID_ARGUMENT, TS_ERR_IO, TS_ERR_OUT_OF_MEMORY,
                       TS_ERR_UNSUPPORTED, TS_OK, TS_TAP_POINTS, TS_WEIGHTS_FULL_PRECISION,
                       TS_WEIGHTS_QUANTIZED, weight_type_bit)
from .server import serve

__version__ = "0.1.0"

__all__ = [
    "BatchEntry", "Capabilities", "Engine", "EngineError", "Session", "SessionOptions", "serve",
    "protocol",
    "weight_type_bit", "TS_OK", "TS_ERR_INVALID_ARGUMENT", "TS_ERR_UNSUPPORTED", "TS_ERR_IO",
    "TS_ERR_OUT_OF_MEMORY", "TS_ERR_CONTEXT_FULL", "TS_ERR_DEVICE", "TS_ERR_INTERNAL",
    "TS_CAP_ALL_POSITION_LOGITS", "TS_CAP_DEVICE_GREEDY", "TS_CAP_BITWISE_DETERMINISM",
    "TS_CAP_STATIC_SHAPES", "TS_CAP_BATCHED_SESSIONS", "TS_CAP_KV_PREFIX_COPY",
    "TS_CAP_BATCH_INVARIANT", "TS_CAP_BITWISE_NOT_ACROSS_FORKS", "TS_WEIGHTS_FULL_PRECISION", "TS_WEIGHTS_QUANTIZED", "TS_TAP_POINTS",
]
