#!/usr/bin/env python3
"""A backend on "another machine": `touchstone parity --backend "stdio:ssh ...
touchstone-backend-runner --stdio LIB"` against a throwaway OpenSSH sshd on
127.0.0.1 (docs/remote-backends.md).

  1. cpu_simd's quick suite (greedy cases, scoring, consistency checks; the
     serving checks left out for CI time) through ssh gives the same rows as the
     same run with a local child:
     every item's verdict and numbers, bit for bit (same machine, same library).
  2. A backend that crashes, exits or hangs behind ssh gives a FAIL row naming
     the call, as a local child does (tests/robustness/bad_backend_test.py,
     run with the stdio: backend): ssh cannot pass a signal, so a crash reads
     "exited with status 255 during decode".

usage: ssh_backend_test.py TOUCHSTONE RUNNER BAD_BACKEND_LIB MANIFEST WORK_DIR BAD_BACKEND_TEST
Exits 77 (SKIP) when sshd or ssh is missing or sshd cannot start here.
"""
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

SSHD = "/usr/sbin/sshd"
# Fields that name the run rather than the computation.
VOLATILE = {"seconds", "path", "started", "finished", "command", "report_path", "host"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sshd(work):
    """A throwaway sshd on a free loopback port with its own host and client keys."""
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{work}/{key}"],
                       check=True)
    shutil.copy(f"{work}/client_key.pub", f"{work}/authorized_keys")
    os.chmod(f"{work}/authorized_keys", 0o600)
    port = free_port()
    with open(f"{work}/sshd_config", "w", encoding="utf-8") as f:
        f.write(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {work}/host_key
AuthorizedKeysFile {work}/authorized_keys
PidFile {work}/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AcceptEnv TOUCHSTONE_BAD_*
""")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation directory
    p = subprocess.run([SSHD, "-f", f"{work}/sshd_config", "-E", f"{work}/sshd.log"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None, f"sshd did not start: {p.stderr.strip()}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return port, ""
        except OSError:
            time.sleep(0.1)
    return None, "sshd is not listening after 10 s"


def ssh_words(work, port):
    """The ssh client command, as words (no spaces inside one: a stdio: spec)."""
    return ["ssh", "-p", str(port), "-i", f"{work}/client_key", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "SendEnv=TOUCHSTONE_BAD_*", "127.0.0.1"]


def rows(report):
    """Every result row without what names the run: comparable across channels."""
    out = []
    for kind in ("cases", "scoring"):
        for r in report.get(kind, []):
            out.append({k: v for k, v in r.items() if k not in VOLATILE})
    return out


def same_as_local(touchstone, manifest, remote, work):
    errors = []
    reports = {}
    for name, backend in (("local", "cpu_simd"), ("ssh", remote)):
        path = f"{work}/{name}.json"
        cmd = [touchstone, "parity", "--backend", backend, "--weights", "quantized",
               "--manifest", manifest, "--threads", "1", "--no-serving", "--json", path]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        print(f"== {name}: exit {p.returncode}\n{p.stdout}", flush=True)
        if p.returncode != 0:
            errors.append(f"{name} run: exit {p.returncode}: {p.stderr[-2000:]}")
            return errors
        with open(path, encoding="utf-8") as f:
            reports[name] = json.load(f)
    local, remote_rows = rows(reports["local"]), rows(reports["ssh"])
    if len(local) != len(remote_rows):
        errors.append(f"{len(local)} local rows, {len(remote_rows)} through ssh")
    for a, b in zip(local, remote_rows):
        if a != b:
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            errors.append(f"row {a.get('name')}: differs through ssh in {diff}")
    if reports["ssh"]["verdict"] != "PASS":
        errors.append(f"verdict through ssh: {reports['ssh']['verdict']}")
    if not errors:
        print(f"ssh: {len(local)} rows identical to the local child's, verdict PASS")
    return errors


def kill_leftovers(work):
    """Remote processes of the bad backend (found by their TOUCHSTONE_BAD_STATE
    under work): a hung one outlives its ssh session (docs/remote-backends.md)."""
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(path, "rb") as f:
                env = f.read().split(b"\0")
            if any(e.startswith(b"TOUCHSTONE_BAD_STATE=" + work.encode()) for e in env):
                os.kill(int(path.split("/")[2]), signal.SIGKILL)
        except OSError:
            pass


def main():
    touchstone, runner, bad_lib, manifest, work, bad_test = sys.argv[1:7]
    if not shutil.which("ssh") or not os.access(SSHD, os.X_OK):
        print("SKIP: needs OpenSSH's sshd and ssh (ci/packages/remote.txt)")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, mode=0o700)
    port, why = start_sshd(work)
    if port is None:
        print(f"SKIP: {why}")
        return 77
    errors = []
    try:
        ssh = " ".join(ssh_words(work, port))
        errors += same_as_local(touchstone, manifest, f"stdio:{ssh} {runner} --stdio cpu_simd", work)
        bad = f"stdio:{ssh} {runner} --stdio {bad_lib}"
        for mode, expect in (("segv", "exited with status 255 during decode"),
                             ("exit0", "exited with status 0 during decode"),
                             ("hang", "timed out after 20 s in decode")):
            p = subprocess.run([sys.executable, bad_test, touchstone, bad, manifest,
                                f"{work}/bad", mode, expect], capture_output=True, text=True,
                               timeout=900)
            print(f"== bad backend '{mode}' through ssh: exit {p.returncode}\n{p.stdout[-3000:]}",
                  flush=True)
            if p.returncode != 0:
                errors.append(f"bad backend '{mode}' through ssh: {p.stdout[-1500:]}")
            kill_leftovers(f"{work}/bad")
    finally:
        with open(f"{work}/sshd.pid", encoding="utf-8") as f:
            os.kill(int(f.read().strip()), signal.SIGTERM)
        kill_leftovers(f"{work}/bad")
    print("\n".join("FAILED: " + e for e in errors) or "remote backend over ssh: PASS")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
