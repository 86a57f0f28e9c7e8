"""An exec: child that misbehaves on purpose (python/tests/robustness_test.py).

usage: misbehaving_child.py MODE STATE_FILE

A standard-library engine with SmolLM2's vocabulary (49,152 tokens) and
constant logits: every case it runs FAILs on logits, which is not what the
tests look at; they look at the row of the case where the child misbehaves.
The decode modes strike in the first decode after prefill number 2 (counted
across restarts in STATE_FILE), so the second case breaks and the harness must
carry on with the third:

  exit_in_decode     os._exit(0)                 raise_in_decode  ValueError
  hang_in_decode     never returns               garbage_in_decode  16 bytes of junk on fd 3
  short_reply        a reply header, half its payload, exit
  wrong_size         a TS_OK reply with 10 logits instead of n_vocab
  wrong_op           a reply carrying another op
  stdout             prints to stdout (print() and os.write(1)) in every call, else behaves
Start modes (every case fails at setup):
  exit_at_start      exits with status 3 before saying hello
  bad_hello          answers the hello with junk
"""

import os
import struct
import sys
import time
from array import array

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from touchstone_engine import Engine, Session, serve  # noqa: E402
from touchstone_engine import protocol as P  # noqa: E402

N_VOCAB = 49152
MODE = sys.argv[1] if len(sys.argv) > 1 else ""
STATE = sys.argv[2] if len(sys.argv) > 2 else ""


def count_prefill():
    n = 0
    if STATE and os.path.exists(STATE):
        with open(STATE, encoding="utf-8") as f:
            n = int(f.read().strip() or 0)
    n += 1
    if STATE:
        with open(STATE, "w", encoding="utf-8") as f:
            f.write(f"{n}\n")
    return n


def chat(what):
    if MODE == "stdout":
        print(f"misbehaving child: print() in {what}")
        os.write(1, f"misbehaving child: os.write(1) in {what}\n".encode())


class BadSession(Session):
    def __init__(self, max_ctx):
        self.pos, self.max_ctx, self.armed = 0, max_ctx, False

    def position(self):
        chat("position")
        return self.pos

    def max_context(self):
        return self.max_ctx

    def prefill(self, tokens, all_positions):
        chat("prefill")
        self.armed = count_prefill() == 2
        self.pos += len(tokens)
        return array("f", bytes(4 * N_VOCAB * (len(tokens) if all_positions else 1)))

    def decode(self, token):
        chat("decode")
        if self.armed:
            self.armed = False
            misbehave()
        self.pos += 1
        return array("f", bytes(4 * N_VOCAB))

    def rewind(self, position):
        self.pos = position


def reply(op, payload):
    os.write(3, P.frame(op | P.REPLY_BIT, payload))


def misbehave():
    if MODE == "exit_in_decode":
        os._exit(0)
    if MODE == "raise_in_decode":
        raise ValueError("deliberate failure in decode")
    if MODE == "hang_in_decode":
        time.sleep(1e9)
    if MODE == "garbage_in_decode":
        os.write(3, b"\xde\xad\xbe\xef" * 4)
        time.sleep(1e9)
    if MODE == "short_reply":
        os.write(3, struct.pack("<IIQ", P.MAGIC, P.DECODE | P.REPLY_BIT, 4 + 4 * N_VOCAB))
        os.write(3, bytes(100))
        os._exit(0)
    if MODE == "wrong_size":
        reply(P.DECODE, P.Writer().i32(P.TS_OK).raw(bytes(40)).bytes())
        time.sleep(1e9)
    if MODE == "wrong_op":
        reply(P.POSITION, P.Writer().i32(P.TS_OK).i32(0).bytes())
        time.sleep(1e9)


class BadEngine(Engine):
    name = "misbehaving"
    version = "0"
    architectures = "llama"
    model_features = ""
    session_class = BadSession

    def device_name(self):
        chat("device_name")
        return "no device"

    def load_model(self, path):
        chat("load_model")

        class M:
            n_vocab = N_VOCAB
        return M()

    def open_session(self, model, options):
        return BadSession(options.max_context or 8192)


def main():
    if MODE == "exit_at_start":
        sys.stderr.write("misbehaving child: exiting before hello\n")
        sys.exit(3)
    if MODE == "bad_hello":
        os.read(3, 1 << 16)
        os.write(3, P.frame(P.HELLO | P.REPLY_BIT, b"\x00\x00\x00\x00junk"))
        time.sleep(1e9)
    serve(BadEngine)


if __name__ == "__main__":
    main()
