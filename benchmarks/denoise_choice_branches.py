"""Which branches of the self-tuning denoiser's choice (:mod:`dkha.apply.choose`) ever change the
chosen candidate on the photographs of ``benchmarks/denoise_photo.py`` (issue 44: the choice
machinery kept only where it earns its lines).

Each ``fit_denoise`` run's scored table (every candidate's risk and regional shares) is kept, and
the choice is made again from it with one branch removed: a family of candidates filtered out
(the fixed point, the learned pre-image, the whole second round, weighted or uniform
aggregation) or one test of ``settle`` dropped (σ̂ ± NOISE_DOUBT, Z_SCORE, MARGIN, or settle
itself: the lowest estimated risk taken). A branch that changes no row's choice never changes a
result. The rule (``auto``'s pick of sure / held-out / anscombe) is seen in the rule column.

    python benchmarks/denoise_choice_branches.py                          # the panel, crop 64
    python benchmarks/denoise_choice_branches.py --photos astronaut camera coins
    python benchmarks/denoise_choice_branches.py --photos immunohistochemistry retina \\
        hubble_deep_field --noise gaussian-0.1 --crop 128

Measured (load 9–18 on the shared 2 cores; 30–130 s a row): every branch changes at least one
row. Panel at crop 64 (24 rows): settle 20, weighted 16, uniform 8, σ̂ ± 15 % 5, Z_SCORE 2,
the fixed point 1 (rocket, gaussian 0.2: σ=1.5×median, r=4, fixed-point); development photographs
at crop 64 (18 rows): MARGIN 1 (coins, gaussian 0.1), Z_SCORE 1, σ̂ ± 15 % 4; judges at crop 128:
the learned pre-image 1 (hubble_deep_field, gaussian 0.1: σ=30×median, r=8, learned).
"""

from __future__ import annotations

import argparse
import os
import time

import _data  # noqa: F401 - first: this checkout's dkha on the path
import numpy as np
from denoise_photo import NOISES, PANEL, add_noise, photograph

from dkha.apply import choose


def settle(scored, *, levels=True, z=True, margin=True):
    """:func:`dkha.apply.choose.settle` with its tests switchable (the candidate only)."""
    lim = [t for t in scored if t[0].width is None]
    ker = [t for t in scored if t[0].width is not None]
    if not lim or not ker:
        return scored[0][0]
    a, b = np.atleast_2d(ker[0][3]), np.atleast_2d(lim[0][3])
    if not levels:
        a, b = a[-1:], b[-1:]

    def wins(s, s0):
        d = s - s0
        err = float(np.sqrt(len(d)) * np.std(d, ddof=1)) if z and len(d) > 1 else 0.0
        return -float(np.sum(d)) > max((choose.MARGIN if margin else 0.0) * lim[0][1],
                                       choose.Z_SCORE * err)
    return ker[0][0] if all(wins(x, y) for x, y in zip(a, b)) else lim[0][0]


def variants(scored) -> dict:
    def only(keep):
        return settle([t for t in scored if keep(t[0])])
    return {"fixed point": only(lambda c: c.preimage != "fixed-point"),
            "learned": only(lambda c: c.preimage != "learned"),
            "second round": only(lambda c: c.preimage in ("linear", "conformal")),
            "weighted": only(lambda c: not c.weighted),
            "uniform": only(lambda c: c.weighted),
            "noise doubt": settle(scored, levels=False),
            "z-score": settle(scored, z=False),
            "margin": settle(scored, margin=False),
            "settle": scored[0][0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", nargs="+", default=list(PANEL))
    ap.add_argument("--noise", nargs="+", default=list(NOISES), choices=NOISES)
    ap.add_argument("--crop", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    kept = {}
    original = choose.settle

    def spy(scored):
        kept["scored"] = list(scored)
        return original(scored)
    choose.settle = spy
    print("load " + " ".join(f"{v:.1f}" for v in os.getloadavg()), flush=True)
    changed: dict = {}
    for i, name in enumerate(args.photos):
        clean = photograph(name, args.crop)
        for kind in args.noise:
            t0 = time.perf_counter()
            res = choose.fit_denoise(add_noise(clean, kind, args.seed + i), seed=args.seed)
            chosen = res.choice.chosen
            assert settle(kept["scored"]) == chosen
            moved = [k for k, c in variants(kept["scored"]).items() if c != chosen]
            for k in moved:
                changed.setdefault(k, []).append(f"{os.path.basename(name)}/{kind}")
            print(f"{os.path.basename(name):10s} {kind:14s} {res.choice.rule:8s} "
                  f"{chosen.label():48s} without it another choice: {', '.join(moved) or '-'} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    for k in variants(kept["scored"]):
        rows = changed.get(k, [])
        print(f"{k:13s} changes {len(rows):2d} rows {' '.join(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
