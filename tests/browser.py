"""Load an HTML page in a real headless Chromium and read back what it decoded."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import tempfile

#: the probe added to a copy of the page: once loaded, every <img> reports its decoded size
PROBE = ("<script>window.addEventListener('load',function(){var w=[];"
         "for(var i of document.images)"
         "{w.push(i.complete?i.naturalWidth+'x'+i.naturalHeight:'0x0')}"
         "document.body.setAttribute('data-decoded',w.join(' '))});</script>")

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000", "--dump-dom")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _dump_dom(page: str, probe: str) -> subprocess.CompletedProcess:
    """Chromium's DOM of the HTML text ``page`` with ``probe`` run once it has loaded."""
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/page.html"
        with open(path, "w") as f:
            f.write(page.replace("</body>", probe + "</body>"))
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={d}/profile",
                               f"file://{path}"], capture_output=True, text=True, timeout=300,
                              check=False)


def decoded_images(page: str) -> list[tuple[int, int]]:
    """``(naturalWidth, naturalHeight)`` of every image of the HTML text ``page`` as Chromium
    decoded it (``(0, 0)`` for one it could not decode)."""
    out = _dump_dom(page, PROBE)
    found = re.findall(r'data-decoded="([^"]*)"', out.stdout)
    assert found, f"Chromium did not run the probe (exit {out.returncode}): {out.stderr[-400:]}"
    return [tuple(int(v) for v in s.split("x")) for s in found[0].split()]


#: the probe that also reads the pixels back: per image its class, alt text, decoded size and the
#: share of its pixels that are coloured (channels differ by more than 40: a colour map's
#: colours, not the white, grey and black of a blank panel, its axes and text)
RENDER_PROBE = (
    "<script>window.addEventListener('load',function(){var out=[];"
    "for(var i of document.images){"
    "var w=i.complete?i.naturalWidth:0,h=i.complete?i.naturalHeight:0,"
    "f=0;if(w&&h){var c=document.createElement('canvas');c.width=w;c.height=h;"
    "var x=c.getContext('2d');x.drawImage(i,0,0);var d=x.getImageData(0,0,w,h).data,n=0;"
    "for(var k=0;k<d.length;k+=4){"
    "var a=Math.max(d[k],d[k+1],d[k+2]),b=Math.min(d[k],d[k+1],d[k+2]);"
    "if(a-b>40)n++}f=n/(w*h)}"
    "out.push([i.className,i.alt,w,h,f.toFixed(4)].join('\\t'))}"
    "var p=document.createElement('pre');p.id='rendered';p.textContent=out.join('\\n');"
    "document.body.appendChild(p)});</script>")


def rendered_images(page: str) -> list[dict]:
    """Every image of the HTML text ``page`` as Chromium rendered it: ``kind`` (its class),
    ``alt``, ``width``, ``height`` (0 when it could not be decoded) and ``coloured``, the share
    of its pixels in colour."""
    out = _dump_dom(page, RENDER_PROBE)
    found = re.search(r'<pre id="rendered">(.*?)</pre>', out.stdout, flags=re.DOTALL)
    assert found, f"Chromium did not run the probe (exit {out.returncode}): {out.stderr[-400:]}"
    images = []
    for line in html.unescape(found.group(1)).splitlines():
        kind, alt, w, h, f = line.split("\t")
        images.append({"kind": kind, "alt": alt, "width": int(w), "height": int(h),
                       "coloured": float(f)})
    return images
