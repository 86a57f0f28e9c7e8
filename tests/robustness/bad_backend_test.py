#!/usr/bin/env python3
"""Runs `touchstone parity` on a deliberately misbehaving backend and checks
that the harness, not the backend, writes the verdict: a complete JSON and
JUnit report, the broken case FAIL with a row naming the cause, the cases
around it judged normally, exit status 1.

usage: bad_backend_test.py TOUCHSTONE BAD_BACKEND_LIB MANIFEST OUT_DIR MODE EXPECT
  EXPECT: text the failing case's failure line must contain.
Modes device_late / unsupported_late: case 2 fails (a deliberate error), then
the backend says "no device" / "unsupported" for case 3: case 3 is a FAIL row
naming that, the run FAIL (never SKIP / UNSUPPORTED). Mode forge: the backend's
strings carry a forged "verdict: PASS" line and an escape sequence; the table
must show them escaped (one verdict line, no ESC byte).
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

CASES = ["one_token", "narrative", "arithmetic"]


def processes_with_env(entry):
    """PIDs whose environment holds `entry` (KEY=VALUE)."""
    pids = []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(path, "rb") as f:
                if entry.encode() in f.read().split(b"\0"):
                    pids.append(int(path.split("/")[2]))
        except OSError:
            pass
    return pids


def killed_run(cmd, env, rj, state):
    """kill -9 the harness while case 2 hangs: the JSON on disk must be a valid
    report of case 1, marked incomplete, and the backend process must be gone."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    report = None
    while time.time() < deadline:
        if p.poll() is not None:  # the harness ended on its own: nothing to kill
            return [f"the harness exited with status {p.returncode} before case 1 finished"]
        try:
            with open(rj, encoding="utf-8") as f:
                report = json.load(f)
            if len(report["cases"]) == 1:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    if report is None or len(report["cases"]) != 1:
        p.kill()
        return ["the report never showed case 1 finished within 300 s"]
    time.sleep(1.0)  # case 2 is now starting or inside the hanging decode
    p.send_signal(signal.SIGKILL)
    p.wait()
    time.sleep(0.5)
    errors = []
    with open(rj, encoding="utf-8") as f:
        report = json.load(f)
    if report["complete"]:
        errors.append("report of a killed run is marked complete")
    if [c["name"] for c in report["cases"]] != CASES[:1] or not report["cases"][0]["passed"]:
        errors.append(f"killed run's report: {report['cases']}")
    if report["passed"]:
        errors.append("killed run's report says passed")
    # PR_SET_PDEATHSIG kills the runner at once; its teardown may take a moment
    # on a loaded machine.
    left = processes_with_env("TOUCHSTONE_BAD_STATE=" + state)
    for _ in range(100):
        if not left:
            break
        time.sleep(0.1)
        left = processes_with_env("TOUCHSTONE_BAD_STATE=" + state)
    if left:
        errors.append(f"backend processes outlived the harness: {left}")
    return errors


def end_leftovers(state):
    """Kills what a failed run left (a re-forking process included); returns
    the PIDs found first."""
    first = processes_with_env("TOUCHSTONE_BAD_STATE=" + state)
    deadline = time.time() + 10
    left = first
    while left and time.time() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
        left = processes_with_env("TOUCHSTONE_BAD_STATE=" + state)
    return first


def wait_until_gone(state, seconds):
    """PIDs of the run still alive after `seconds` of grace (none: [])."""
    deadline = time.time() + seconds
    left = processes_with_env("TOUCHSTONE_BAD_STATE=" + state)
    while left and time.time() < deadline:
        time.sleep(0.05)
        left = processes_with_env("TOUCHSTONE_BAD_STATE=" + state)
    return left


def default_stop_signals():
    """In the harness before exec: a stop signal the test's caller ignores
    (SIGINT in a background job) must still reach the harness."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def stopped_run(cmd, env, rj, state, sig):
    """Stops the harness with `sig` while case 2 hangs after starting four
    grandchildren (own group, own session, re-forking, runner's group): the
    harness must end by that signal, its report of case 1 stay on disk, and no
    process of the run outlive it by more than 3 s."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         preexec_fn=default_stop_signals)
    deadline = time.time() + 120
    ready = False
    while time.time() < deadline and p.poll() is None:
        # the harness, the runner and the four grandchildren
        ready = len(processes_with_env("TOUCHSTONE_BAD_STATE=" + state)) >= 6
        if ready:
            break
        time.sleep(0.1)
    if not ready:
        p.kill()
        p.wait()
        end_leftovers(state)
        return [f"the grandchildren never started (harness status {p.returncode})"]
    time.sleep(0.2)
    p.send_signal(sig)
    errors = []
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        errors.append(f"the harness did not end within 10 s of {sig.name}")
    if not errors and p.returncode != -sig:
        errors.append(f"harness status {p.returncode}, expected {-sig} (ended by {sig.name})")
    left = wait_until_gone(state, 3.0)
    if left:
        errors.append(f"{len(left)} processes of the run outlived the harness by 3 s: {left}")
    end_leftovers(state)
    with open(rj, encoding="utf-8") as f:
        report = json.load(f)
    if report["complete"] or [c["name"] for c in report["cases"]] != CASES[:1]:
        errors.append(f"report of the stopped run: complete={report['complete']}, "
                      f"cases {[c['name'] for c in report['cases']]}")
    return errors


def orphan_run(cmd, env, state):
    """The backend starts grandchildren (one setsid()); the run must PASS and
    leave no process of the backend behind once `touchstone parity` returns."""
    # Output to a file, not a pipe: a leftover grandchild would hold a pipe open.
    log = state + ".log"
    with open(log, "wb") as f:
        p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=600)
    with open(log, encoding="utf-8", errors="replace") as f:
        print(f.read())
    errors = [] if p.returncode == 0 else [f"exit status {p.returncode}, expected 0"]
    left = end_leftovers(state)
    if left:
        errors.append(f"processes the backend started outlived the run: {left}")
    return errors


def main():
    touchstone, lib, manifest, out, mode, expect = sys.argv[1:7]
    os.makedirs(out, exist_ok=True)
    state = os.path.join(out, f"{mode}.state")
    if os.path.exists(state):
        os.remove(state)
    rj, rx = os.path.join(out, f"{mode}.json"), os.path.join(out, f"{mode}.xml")
    for old in (rj, rx):  # a report of an earlier run must not be mistaken for this one's
        if os.path.exists(old):
            os.remove(old)
    env = dict(os.environ, TOUCHSTONE_BAD_MODE=mode, TOUCHSTONE_BAD_STATE=state)
    if mode.endswith("_sweep"):  # the fallback for hosts without a writable cgroup v2
        env["TOUCHSTONE_NO_CGROUP"] = "1"
        mode = env["TOUCHSTONE_BAD_MODE"] = mode[:-len("_sweep")]
    cmd = [touchstone, "parity", "--backend", lib, "--manifest", manifest, "--json", rj,
           "--junit", rx, "--timeout", "20", "--max-steps", "8"]
    for c in CASES:
        cmd += ["--case", c]
    if mode in ("orphan", "setpgid", "refork"):
        errors = orphan_run(cmd, env, state)
        print("\n".join("FAILED: " + e for e in errors) or "orphan run: PASS, nothing left running")
        return 1 if errors else 0
    stop = {"sigterm": signal.SIGTERM, "sigint": signal.SIGINT, "sighup": signal.SIGHUP,
            "sigkill": signal.SIGKILL}
    if mode in stop:
        sig = stop[mode]
        env["TOUCHSTONE_BAD_MODE"] = "spawn_hang"
        cmd[cmd.index("--timeout") + 1] = "600"
        errors = stopped_run(cmd, env, rj, state, sig)
        print("\n".join("FAILED: " + e for e in errors) or
              f"{sig.name} mid-run: the harness ended by it, nothing left running")
        return 1 if errors else 0
    if mode == "killed":
        env["TOUCHSTONE_BAD_MODE"] = "hang"
        cmd[cmd.index("--timeout") + 1] = "600"
        errors = killed_run(cmd, env, rj, state)
        print("\n".join("FAILED: " + e for e in errors) or "killed run: valid incomplete report")
        return 1 if errors else 0
    p = subprocess.run(cmd, env=env, capture_output=True, timeout=600)
    out_text = p.stdout.decode(errors="replace")
    print(out_text)
    print(p.stderr.decode(errors="replace"), file=sys.stderr)
    errors = []
    if p.returncode != 1:
        errors.append(f"exit status {p.returncode}, expected 1")
    if "verdict: FAIL" not in out_text:
        errors.append("no 'verdict: FAIL' line in the table")
    with open(rj, encoding="utf-8") as f:  # must be valid UTF-8 JSON
        report = json.load(f)
    ET.parse(rx)  # must be well-formed XML
    if not report["complete"]:
        errors.append("report not marked complete")
    names = [c["name"] for c in report["cases"]]
    if names != CASES:
        errors.append(f"report has cases {names}, expected {CASES}")
    every_case_fails = mode in ("n_vocab", "names")
    late = mode in ("device_late", "unsupported_late")  # case 3 fails too
    for i, c in enumerate(report["cases"]):
        should_pass = not every_case_fails and i != 1 and not (late and i > 1)
        if c["passed"] != should_pass:
            errors.append(f"case {c['name']}: passed={c['passed']}, expected {should_pass}")
        want = "deliberate error" if late and i == 1 else expect
        if not should_pass and not any(want in f for f in c["failures"]):
            errors.append(f"case {c['name']}: no failure mentions {want!r}: {c['failures']}")
    if report["verdict"] != "FAIL":
        errors.append(f"report verdict {report['verdict']}, expected FAIL")
    verdict_lines = [ln for ln in out_text.splitlines() if ln.lstrip().startswith("verdict")]
    if verdict_lines != ["verdict: FAIL"]:
        errors.append(f"the table's verdict lines are {verdict_lines}, expected one 'verdict: FAIL'")
    if "\x1b" in out_text:
        errors.append("the table holds an ESC byte: a backend string reached the terminal raw")
    if errors:
        print("\n".join("FAILED: " + e for e in errors))
        return 1
    print(f"bad backend '{mode}': complete report, FAIL row names the cause, exit 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
