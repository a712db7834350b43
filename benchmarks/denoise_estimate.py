"""Does ``dkha denoise``'s printed PSNR hold what it delivers (issue 43)? Per photograph and noise
level: the PSNR printed before (the chosen candidate's SURE at σ̂ read as its MSE), the expected
PSNR printed now with its range (:mod:`dkha.apply.estimate`), the PSNR delivered, and whether
the point is within 0.5 dB of it (``point``) or the range holds it (``range``, ``range±0.5``:
within 0.5 dB of an end).

Photographs, noise and crop as ``benchmarks/denoise_photo.py`` (gaussian noise, seeded by
``--seed`` + the photograph's index, clipped to [0, 1]). The default panel (chelsea, coffee,
rocket, moon) was not used to build the estimate: the clip model, the calibrated noise
level and TEXTURE_DOUBT were set while developing on astronaut, camera, coins, brick, grass and
clock (``--photos astronaut camera coins brick grass clock`` shows them).

    python benchmarks/denoise_estimate.py                                  # 12 rows, crop 128
    python benchmarks/denoise_estimate.py --photos coffee --noise gaussian-0.1 --crop 64
    python benchmarks/denoise_estimate.py --photos kept_aside.png          # a judge
"""

from __future__ import annotations

import argparse
import os
import time

import _data  # noqa: F401 - first: this checkout's dkha on the path
import numpy as np
from denoise_photo import add_noise, photograph

from dkha.apply.choose import fit_denoise
from dkha.apply.estimate import psnr_of

PANEL = ("chelsea", "coffee", "rocket", "moon")
GAUSSIAN = ("gaussian-0.05", "gaussian-0.1", "gaussian-0.2")
DEVELOPMENT = ("astronaut", "camera", "coins", "brick", "grass", "clock")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", nargs="+", default=list(PANEL))
    ap.add_argument("--noise", nargs="+", default=list(GAUSSIAN), choices=GAUSSIAN)
    ap.add_argument("--crop", type=int, default=128, help="side of the centre crop (pixels)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    used = sorted(set(args.photos) & set(DEVELOPMENT))
    print(f"{len(args.photos)} photographs {args.crop}×{args.crop} grey"
          + (f" ({', '.join(used)} used while developing)" if used else
             " (none used while developing)")
          + "; PSNR dB; load " + " ".join(f"{v:.1f}" for v in os.getloadavg()), flush=True)
    print(f"{'photo':10s} {'noise':14s} {'before':>7s} {'Δ':>6s}  {'now (range)':28s} "
          f"{'delivered':>9s} {'Δ':>6s}  holds", flush=True)
    t_start = time.perf_counter()
    counts = {"before": 0, "point": 0, "range": 0, "range±0.5": 0}
    rows = 0
    for i, name in enumerate(args.photos):
        clean = photograph(name, args.crop)
        for kind in args.noise:
            t0 = time.perf_counter()
            res = fit_denoise(add_noise(clean, kind, args.seed + i), seed=args.seed)
            got = float(10 * np.log10(1.0 / np.mean((res.image - clean) ** 2)))
            before = psnr_of(res.choice.risk)
            e = res.choice.estimate
            holds = {"before": abs(before - got) <= 0.5, "point": abs(e.psnr - got) <= 0.5,
                     "range": e.low <= got <= e.high,
                     "range±0.5": e.low - 0.5 <= got <= e.high + 0.5}
            for k, v in holds.items():
                counts[k] += v
            rows += 1
            print(f"{os.path.basename(name):10s} {kind:14s} {before:7.2f} {before - got:+6.2f}  "
                  f"{e.text():28s} {got:9.2f} {e.psnr - got:+6.2f}  "
                  f"{', '.join(k for k, v in holds.items() if v and k != 'before') or 'NO'} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print("within 0.5 dB or held, of " + f"{rows} rows: "
          + ", ".join(f"{k} {v}" for k, v in counts.items())
          + f"; {time.perf_counter() - t_start:.0f} s; load "
          + " ".join(f"{v:.1f}" for v in os.getloadavg()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
