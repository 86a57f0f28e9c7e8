#!/usr/bin/env python3
"""touchstone-backend-runner bounds what one request can make it allocate.

usage: runner_request_test.py RUNNER BACKEND_LIB MODEL_GGUF

Speaks the child-process protocol (docs/protocol.md) to the runner on its
stdio, loads the model, opens one session and sends two step_batch requests
of about 1.3 MB each that would make a runner sizing buffers from the request
alone allocate tens of GB: 65,536 entries of the same session (one token
each), and one all-positions entry of 320,000 tokens. Each must be refused
with TS_ERR_INVALID_ARGUMENT and a message naming the cause, the runner's
address space limited to 4 GiB and its peak resident memory staying under
2 GiB; then a decode on the same session still works.
"""
import resource
import struct
import subprocess
import sys

MAGIC, REPLY = 0x31505354, 0x8000
HELLO, LOAD, OPEN, DECODE, STEP_BATCH = 1, 3, 5, 8, 14
TS_OK, TS_ERR_INVALID_ARGUMENT = 0, 1


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def s(text):
    b = text.encode()
    return struct.pack("<I", len(b)) + b


class Runner:
    def __init__(self, runner, lib):
        self.p = subprocess.Popen([runner, "--stdio", lib], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, preexec_fn=limit_memory)

    def call(self, op, payload):
        self.p.stdin.write(struct.pack("<IIQ", MAGIC, op, len(payload)) + payload)
        self.p.stdin.flush()
        magic, rop, n = struct.unpack("<IIQ", self.p.stdout.read(16))
        assert magic == MAGIC and rop == op | REPLY, (magic, rop)
        body = self.p.stdout.read(n)
        status = struct.unpack("<i", body[:4])[0]
        return status, body[4:]

    def peak_rss_kib(self):
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0


def error_text(body):
    n = struct.unpack("<I", body[:4])[0]
    return body[4:4 + n].decode(errors="replace")


def main():
    runner, lib, model = sys.argv[1:4]
    r = Runner(runner, lib)
    errors = []
    try:
        st, _ = r.call(HELLO, struct.pack("<I", 4))
        assert st == TS_OK, "hello failed"
        st, body = r.call(LOAD, s(model))
        assert st == TS_OK, f"load_model: {error_text(body)}"
        mh, n_vocab = struct.unpack("<Qi", body[:12])
        st, body = r.call(OPEN, struct.pack("<Qiii", mh, 0, 1, 64) + s(""))
        assert st == TS_OK, f"open_session: {error_text(body)}"
        sh = struct.unpack("<Q", body[:8])[0]
        one = struct.pack("<Qiii", sh, 0, 1, 1)
        n_tokens = 320000
        requests = {
            "65,536 entries of one session": (struct.pack("<I", 65536) + one * 65536,
                                              "repeats the session"),
            f"one all-positions entry of {n_tokens} tokens": (
                struct.pack("<IQii", 1, sh, 1, n_tokens) + struct.pack("<i", 1) * n_tokens,
                "a logits reply may carry"),
        }
        for what, (payload, want) in requests.items():
            st, body = r.call(STEP_BATCH, payload)
            text = error_text(body) if st != TS_OK else ""
            print(f"{what} ({len(payload)} bytes): status {st}: {text}")
            if st != TS_ERR_INVALID_ARGUMENT or want not in text:
                errors.append(f"{what}: status {st} {text!r}, expected "
                              f"TS_ERR_INVALID_ARGUMENT naming {want!r}")
        peak = r.peak_rss_kib()
        print(f"runner peak resident memory: {peak / 1024:.0f} MiB (n_vocab {n_vocab})")
        if peak > 2 << 20:
            errors.append(f"the runner's peak resident memory reached {peak / 1024:.0f} MiB")
        st, body = r.call(DECODE, struct.pack("<Qi", sh, 1))
        if st != TS_OK or len(body) != 4 * n_vocab:
            errors.append(f"a decode after the refused requests: status {st}")
    finally:
        r.p.stdin.close()
        r.p.wait(timeout=60)
    if errors:
        print("\n".join("FAILED: " + e for e in errors))
        return 1
    print("runner: oversized requests refused before allocating, the session still works")
    return 0


if __name__ == "__main__":
    sys.exit(main())
