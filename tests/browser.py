"""Load an HTML page in a real headless Chromium and read back what it decoded."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

#: the probe added to a copy of the page: once loaded, every <img> reports its decoded size
PROBE = ("<script>window.addEventListener('load',function(){var w=[];"
         "for(var i of document.images){w.push(i.complete?i.naturalWidth+'x'+i.naturalHeight:'0x0')}"
         "document.body.setAttribute('data-decoded',w.join(' '))});</script>")

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000", "--dump-dom")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def decoded_images(page: str) -> list[tuple[int, int]]:
    """``(naturalWidth, naturalHeight)`` of every image of the HTML text ``page`` as Chromium
    decoded it (``(0, 0)`` for one it could not decode)."""
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/page.html"
        with open(path, "w") as f:
            f.write(page.replace("</body>", PROBE + "</body>"))
        out = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={d}/profile",
                              f"file://{path}"], capture_output=True, text=True, timeout=180)
    found = re.findall(r'data-decoded="([^"]*)"', out.stdout)
    assert found, f"Chromium did not run the probe (exit {out.returncode}): {out.stderr[-400:]}"
    return [tuple(int(v) for v in s.split("x")) for s in found[0].split()]
