#!/usr/bin/env python3
"""The HTML report in a real browser (headless Chromium, docs/report-format.md).

Makes a PASS and a FAIL report (a greedy case + a scoring passage each), renders
`touchstone summary --html` of both, then
  (a) takes a screenshot: the PNG must not be blank (several colours, among them
      the PASS green and the FAIL red of the matrix cells), decoded with zlib only;
  (b) dumps the DOM: the matrix, the KL and margin plots of every case, the KL plot
      of every passage, the near-tie band and the first-divergence line are there;
  (c) the file is self-contained: no script, no external stylesheet, font or image.

usage: browser_test.py TOUCHSTONE MANIFEST WORKDIR BACKEND WEIGHTS
Browser: $TOUCHSTONE_CHROMIUM, else chromium-headless-shell, chromium,
chromium-browser on PATH. Missing: SKIP (77) with the reason, but FAIL when CI=true.
"""
import html.parser
import os
import shutil
import struct
import subprocess
import sys
import zlib

SKIP = 77
PASS_BG = (0xC8, 0xE6, 0xC9)  # .ts-PASS
FAIL_BG = (0xFF, 0xCD, 0xD2)  # .ts-FAIL


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def find_browser():
    env = os.environ.get("TOUCHSTONE_CHROMIUM")
    if env:
        return env if shutil.which(env) else None
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browser(exe, profile, *args):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}", *args]
    print("$", " ".join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=90)
    except subprocess.TimeoutExpired:
        fail("the browser did not finish within 90 s")
    if p.returncode != 0:
        fail(f"the browser exited with {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}")
    return p.stdout.decode("utf-8", "replace")


def png_pixels(path):
    """(width, height, rows of RGB tuples' bytes, bytes per pixel) of an 8-bit RGB(A) PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path} is not a PNG")
    pos, idat, width, height, bpp = 8, b"", 0, 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace:
                fail(f"unexpected PNG format: depth {depth}, colour type {colour}")
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for x in range(bpp, stride):
                line[x] = (line[x] + line[x - bpp]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif f == 3:
            for x in range(stride):
                left = line[x - bpp] if x >= bpp else 0
                line[x] = (line[x] + ((left + prev[x]) >> 1)) & 255
        elif f == 4:
            for x in range(stride):
                a = line[x - bpp] if x >= bpp else 0
                b, c = prev[x], prev[x - bpp] if x >= bpp else 0
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows, bpp


def screenshot_problem(path):
    """None for a rendered page, else what is wrong with the screenshot."""
    width, height, rows, bpp = png_pixels(path)
    colours = set()
    for row in rows[::4]:  # every 4th row, every pixel: enough to see the matrix cells
        for x in range(0, len(row), bpp):
            colours.add(tuple(row[x:x + 3]))
    print(f"screenshot {width}x{height}: {len(colours)} distinct colours")
    if len(colours) < 16:
        return f"the screenshot is (nearly) blank: {len(colours)} colours"
    for name, rgb in (("PASS green", PASS_BG), ("FAIL red", FAIL_BG)):
        if rgb not in colours:
            return f"no {name} {rgb} pixel: the verdict matrix did not render"
    return None


def write_blank_png(path, width=64, height=32):
    """A one-colour RGB PNG (filter 0 rows), to show the check fails on a blank page."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    rows = b"".join(b"\0" + b"\xff" * (3 * width) for _ in range(height))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                                    0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


class Elements(html.parser.HTMLParser):
    """Every element's tag, classes and attributes, in document order."""

    def __init__(self):
        super().__init__()
        self.elements = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, set((a.get("class") or "").split()), a))

    handle_startendtag = handle_starttag


def check_dom(dom):
    p = Elements()
    p.feed(dom)
    els = p.elements

    def count(tag, cls, **attrs):
        return sum(1 for t, c, a in els if t == tag and cls <= c
                   and all(a.get(k) == v for k, v in attrs.items()))

    need = [(("table", {"ts-matrix"}), {}), (("td", {"ts-cell", "ts-PASS"}), {}),
            (("td", {"ts-cell", "ts-FAIL"}), {}),
            (("svg", {"ts-plot", "ts-plot-kl"}), {"data-case": "narrative"}),
            (("svg", {"ts-plot", "ts-plot-margin"}), {"data-case": "narrative"}),
            (("svg", {"ts-plot", "ts-plot-kl"}), {"data-case": "alice_ch1"}),
            (("rect", {"ts-near-tie-band"}), {}), (("line", {"ts-first-divergence"}), {}),
            (("polyline", {"ts-series"}), {})]
    for (tag, cls), attrs in need:
        n = count(tag, cls, **attrs)
        print(f"  {tag}.{'.'.join(sorted(cls))} {attrs or ''}: {n}")
        if n == 0:
            fail(f"the DOM has no <{tag} class=\"{' '.join(sorted(cls))}\"> {attrs}")
    # Two runs: each has the KL + margin plots of narrative and the KL plot of alice_ch1;
    # the FAIL run marks the first divergence in each of its three plots.
    if count("svg", {"ts-plot"}) != 6:
        fail(f"expected 6 plots, found {count('svg', {'ts-plot'})}")
    if count("line", {"ts-first-divergence"}) != 3:
        fail("expected a first-divergence line in each of the FAIL run's 3 plots")


def check_self_contained(page):
    low = page.lower()
    for bad in ("<script", "<link", "<img", "<iframe", "@import", "url(", "src="):
        if bad in low:
            fail(f"the HTML is not self-contained: it has {bad!r}")
    for chunk in low.split("href=\"")[1:]:
        if not chunk.startswith("#"):
            fail(f"the HTML links outside itself: href=\"{chunk[:60]}")


def run(cmd, expect_rc):
    print("$", " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != expect_rc:
        print(p.stdout[-3000:], p.stderr[-3000:])
        fail(f"exit status {p.returncode}, expected {expect_rc}")


def main():
    if len(sys.argv) != 6:
        print(__doc__)
        return 2
    touchstone, manifest, work, backend, weights = sys.argv[1:]
    exe = find_browser()
    if exe is None:
        msg = "no headless Chromium (apt-get install chromium-headless-shell, or set " \
              "TOUCHSTONE_CHROMIUM)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            fail(msg + "; CI=true: a missing browser fails, never skips")
        print(f"SKIP: {msg}")
        return SKIP
    os.makedirs(work, exist_ok=True)
    base = [touchstone, "parity", "--manifest", manifest, "--threads", "1", "--backend", backend,
            "--weights", weights, "--case", "narrative", "--scoring", "alice_ch1",
            "--max-steps", "8", "--max-positions", "32", "--no-consistency"]
    reports = [os.path.join(work, "pass.json"), os.path.join(work, "fail.json")]
    run(base + ["--json", reports[0]], 0)
    run(base + ["--json", reports[1], "--fault", "logits_perturb_1e-3"], 1)
    page = os.path.join(work, "report.html")
    run([touchstone, "summary", *reports, "--html", page], 1)
    with open(page, encoding="utf-8") as f:
        check_self_contained(f.read())
    profile = os.path.join(work, "chromium-profile")
    shot = os.path.join(work, "report.png")
    if os.path.exists(shot):
        os.remove(shot)
    url = "file://" + os.path.abspath(page)
    browser(exe, profile, f"--screenshot={shot}", "--window-size=1280,1400", url)
    if not os.path.exists(shot):
        fail("the browser wrote no screenshot")
    blank = os.path.join(work, "blank.png")
    write_blank_png(blank)
    if screenshot_problem(blank) is None:
        fail("the screenshot check passes a blank image")
    problem = screenshot_problem(shot)
    if problem:
        fail(problem)
    check_dom(browser(exe, profile, "--dump-dom", url))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
