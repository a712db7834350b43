"""The ``dkha`` command line's parser: every subcommand's arguments, their help and defaults.

Built from light modules only (the parameter table :mod:`dkha.estimators.params` and the names
of :mod:`dkha.names`), so that ``dkha --version``, ``--help``, ``dkha CMD --help`` and argument
errors answer before dask, distributed, xarray, scikit-learn and numba load; the commands that
run (:mod:`dkha.cli.main`, :mod:`dkha.cli.fit`, :mod:`dkha.cli.apply`) load them.

An argument error prints the usage of the subcommand it belongs to, and an unknown option the
nearest option that subcommand has (``did you mean --sigma?``).
"""

from __future__ import annotations

import argparse
import difflib
import re

from dkha.algorithms import KHA_DEFAULT
from dkha.cli.options import (
    add_cluster_options,
    add_storage_options,
    float_list,
    name_values,
    positive_int,
)
from dkha.estimators.params import BATCH, add_options
from dkha.names import BATCH_ALGORITHMS, config_default
from dkha.version import __version__

TYPES = {"positive_int": positive_int, "float_list": float_list, "name_values": name_values}


class Parser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` whose errors name what was nearly meant: an unknown
    option is reported with its subcommand's usage and the nearest option name, an invalid
    choice with the nearest choice."""

    #: the actions whose options :meth:`given` can tell apart from their defaults
    _PLAIN = (argparse._StoreAction, argparse._StoreTrueAction, argparse._StoreFalseAction,
              argparse._StoreConstAction)

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        if args is not None and self._subparsers is None:     # (argparse's: no subcommands)
            parsed.given = self.given(args)
        if getattr(self, "top_level", False):
            if extras:      # what no subcommand took
                owner = getattr(parsed, "subcommand_parser", None) or self
                owner.error(unrecognized(extras, owner))
            # -v counts before and after the subcommand's name
            parsed.verbose += getattr(parsed, "verbose_after", 0)
            parsed.__dict__.pop("verbose_after", None)
        return parsed, extras

    def given(self, args) -> set[str]:
        """The destinations of the options ``args`` gives explicitly (a default given
        explicitly included): parsed again into a namespace holding a marker for each, which
        only a given option replaces (argparse sets a default only where the namespace has no
        value). ``dkha fit --resume`` takes the others from the checkpoint."""
        marker = object()
        plain = [a for a in self._actions if isinstance(a, self._PLAIN)]
        probe = argparse.Namespace(**{a.dest: marker for a in plain})
        super().parse_known_args(list(args), probe)
        return {a.dest for a in plain if getattr(probe, a.dest) is not marker}

    def error(self, message: str):
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            options = re.findall(r"'([^']*)'", choice.group(2))
            near = difflib.get_close_matches(choice.group(1), options, n=1)
            if near:
                message += f"; did you mean {near[0]}?"
        super().error(message)


def option_names(parser: argparse.ArgumentParser) -> list[str]:
    """Every long option ``parser`` takes."""
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


def unrecognized(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """``unrecognized arguments: …``, with the nearest option of ``parser`` to each unknown
    one."""
    names = option_names(parser)
    hints = []
    for word in extras:
        if word.startswith("--"):
            near = difflib.get_close_matches(word.split("=", 1)[0], names, n=1, cutoff=0.6)
            if near:
                hints.append(f"did you mean {near[0]} (for {word.split('=', 1)[0]})?"
                             if len([w for w in extras if w.startswith("-")]) > 1
                             else f"did you mean {near[0]}?")
    return "unrecognized arguments: " + " ".join(extras) + ("; " + " ".join(hints)
                                                             if hints else "")


def _subcommand(sub, name: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand's parser: it knows itself (its errors show its own usage) and takes ``-v``
    after its name as well as before."""
    p = sub.add_parser(name, **kwargs)
    p.set_defaults(subcommand_parser=p)
    p.add_argument("-v", "--verbose", dest="verbose_after", action="count", default=0,
                   help="log more (-vv: debug); the same as -v before the subcommand")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="dkha", description="Kernel PCA by the Kernel Hebbian Algorithm family, "
                    "for data sets too large for a kernel matrix.",
                    epilog="dkha COMMAND --help shows a command's options and their defaults.")
    parser.add_argument("--version", action="version", version=f"dkha {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-vv: debug); also after the subcommand")
    parser.top_level = True
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=Parser)
    _demo_parser(sub)
    _ingest_parsers(sub)
    add_fit_parsers(sub)
    _run_parser(sub)
    add_apply_parsers(sub)
    _evaluate_parser(sub)
    _transform_parser(sub)
    _report_parser(sub)
    _maps_parser(sub)
    return parser


def _demo_parser(sub) -> None:
    p = _subcommand(sub, "demo", help="ingest scikit-learn's digits and fit KHA-SMD from a random "
                    "start (no cluster needed)")
    p.add_argument("-o", "--out", metavar="DIR",
                   help="directory for the store and run (default: a new temporary directory, "
                        "dkha-demo-* under the system's temp folder, printed)")
    p.add_argument("--passes", type=positive_int, default=20,
                   help="passes through the digits (default 20)")
    p.add_argument("--algorithm", default=KHA_DEFAULT, choices=BATCH_ALGORITHMS,
                   help=f"the batch algorithm (default {KHA_DEFAULT})")
    add_cluster_options(p)


def _ingest_parsers(sub) -> None:
    p = sub.add_parser("ingest", help="create a data store")
    p.set_defaults(subcommand_parser=p)
    isub = p.add_subparsers(dest="kind", required=True, metavar="KIND", parser_class=Parser)
    chunk_rows = (f"samples per zarr chunk, the unit of work of a task (default "
                  f"{config_default('chunk-rows')}, dkha.chunk-rows)")
    a = _subcommand(isub, "array", help="from a .npy array (samples × features)")
    a.add_argument("src", help="the .npy array, one sample a row")
    a.add_argument("-o", "--out", required=True, metavar="STORE", help="the data store to create")
    a.add_argument("--labels", help=".npy of one label per sample (default: no labels)")
    a.add_argument("--patch", type=positive_int, metavar="P",
                   help="the rows are P×P image patches flattened row by row (P² features): "
                        "recorded so that fits get the patch defaults (σ = 3× the median "
                        "distance), component pictures, dkha maps and dkha denoise")
    a.add_argument("--step", type=positive_int, metavar="S",
                   help="with --patch: pixels between the patch positions on which dkha maps "
                        "and dkha denoise cut whole images (default 2)")
    a.add_argument("--chunk-rows", type=positive_int, metavar="N", help=chunk_rows)
    a.add_argument("--overwrite", action="store_true", help="replace an existing store")
    add_storage_options(a)
    im = _subcommand(isub, "images", help="grey-scale patches of images (skimage:NAME for "
                     "bundled ones)")
    im.add_argument("images", nargs="+", metavar="IMAGE",
                    help="image files (colour is made grey), or skimage:NAME (e.g. skimage:camera)")
    im.add_argument("-o", "--out", required=True, metavar="STORE", help="the data store to create")
    im.add_argument("--patch", type=positive_int, default=11, metavar="P",
                    help="side of the square patches in pixels: P² features (default 11)")
    im.add_argument("--step", type=positive_int, default=2, metavar="S",
                    help="pixels between neighbouring patch positions, across and down "
                         "(default 2)")
    im.add_argument("--max-samples", type=positive_int, metavar="N",
                    help="keep N patches drawn uniformly (seeded) from all the images' patch "
                         "positions, in raster order (default: every position)")
    im.add_argument("--seed", type=int, default=0,
                    help="seed of the --max-samples draw (default 0)")
    im.add_argument("--chunk-rows", type=positive_int, metavar="N", help=chunk_rows)
    im.add_argument("--overwrite", action="store_true", help="replace an existing store")
    add_storage_options(im)


def add_fit_parsers(sub) -> None:
    """Add ``fit`` and ``tune`` to the ``dkha`` command's subparsers."""
    p = _subcommand(sub, "fit", help="fit kernel principal components")
    p.add_argument("store", help="the data store (dkha ingest)")
    p.add_argument("-o", "--out", required=True, metavar="RUN_DIR",
                   help="the run directory to write (components.zarr, history, timings)")
    add_options(p, types=TYPES)
    p.add_argument("--overwrite", action="store_true", help="replace a different run in RUN_DIR")
    c = p.add_mutually_exclusive_group()
    c.add_argument("--checkpoint-every", type=positive_int, metavar="N",
                   help="write the complete state to RUN_DIR/checkpoints every N passes (Krylov: "
                        "products). SIGTERM and Ctrl-C also checkpoint, then exit with code 75. "
                        "Default: the KHA algorithms none; the default fit and krylov checkpoint "
                        "by themselves (the Krylov solve after its products, at most ~5 %% of "
                        "its time)")
    c.add_argument("--checkpoint-steps", type=positive_int, metavar="N",
                   help="write the complete state at the first block boundary after every N "
                        "steps")
    p.add_argument("--resume", action="store_true",
                   help="continue RUN_DIR's run from its newest valid checkpoint, bit for bit, "
                        "with the settings it records (an option given that differs is refused)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar in a terminal, no progress lines in a pipe")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_cluster_options(p)

    p = _subcommand(sub, "tune", help="try the {1,2,5}×10^b grid of eta0 (and mu) in one kernel "
                    "stream; keep the best run of each algorithm")
    p.add_argument("store", help="the data store (dkha ingest)")
    p.add_argument("-o", "--out", required=True, metavar="TUNE_DIR",
                   help="gets tune.json (every setting's excess error) and TUNE_DIR/<algorithm>, "
                        "the best run (resumable: continue it with dkha fit ... --resume)")
    p.add_argument("--algorithm", default=KHA_DEFAULT,
                   help=f"batch algorithm(s) to tune, comma-separated (default {KHA_DEFAULT})")
    p.add_argument("--eta0", type=float_list, metavar="ETA0[,ETA0...]",
                   help="values to try (default 0.001,0.002,0.005,…,5: {1,2,5}×10^b, b = −3…0)")
    p.add_argument("--mu", type=float_list, metavar="MU[,MU...]",
                   help="kha-smd: meta-gains to try with every eta0 (default 0.01,…,0.5,1)")
    p.add_argument("--passes", type=positive_int, default=3,
                   help="passes of every setting, judged by the excess error after them "
                        "(default 3)")
    add_options(p, (BATCH,), types=TYPES, defaults={"evaluate_every": 0},
                skip={"algorithm", "eta0", "mu", "passes", "steps", "tol", "projections"})
    p.add_argument("--overwrite", action="store_true",
                   help="tune into a TUNE_DIR that is not empty")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar in a terminal, no progress lines in a pipe")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_cluster_options(p)


def _run_parser(sub) -> None:
    p = _subcommand(sub, "run", help="run a pipeline file (TOML): ingest → fit → evaluate → "
                    "apply → report")
    p.add_argument("pipeline", help="the pipeline file (TOML)")
    p.add_argument("--run-id", help="name of the run directory (default: the pipeline's name)")
    p.add_argument("--runs-dir", default="runs", help="where run directories go (default ./runs)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_cluster_options(p)


def _evaluate_parser(sub) -> None:
    p = _subcommand(sub, "evaluate", help="reconstruction error E(A), E_min and the excess "
                    "(eq. 22); online runs: the AC index; --variance: explained variance (eq. 23)")
    p.add_argument("run_dir", help="a run directory (dkha fit)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--recompute", action="store_true",
                   help="recompute the top eigenvalues of K' instead of reusing the fit's")
    p.add_argument("--exact", action="store_true",
                   help="the exact E_min even where neither the fit nor the data store's cache "
                        "has the top eigenvalues of K' (a Krylov solve: as costly as an exact "
                        "fit; cached in the data store for later fits and evaluations); without "
                        "it such a run shows E(A) only")
    p.add_argument("--variance", action="store_true",
                   help="also Honeine's explained variance per component (eq. 23), blockwise "
                        "over the training store")
    p.add_argument("--variance-samples", type=positive_int, metavar="N",
                   help="estimate the variance on a seeded sample of N rows (huge stores; "
                        "default: every row)")
    p.add_argument("--cache-rows", action="store_true", default=None,
                   help="keep the kernel's tiles in worker memory while evaluating (pays when "
                        "the eigenvalues are recomputed: every Krylov iteration is a pass)")
    add_cluster_options(p)


def _transform_parser(sub) -> None:
    p = _subcommand(sub, "transform", help="project a data store on the components")
    p.add_argument("run_dir", help="a run directory (dkha fit)")
    p.add_argument("new_store", help="the data store to project (same features as the run's)")
    p.add_argument("-o", "--out", required=True,
                   help="zarr store for the projection (sample × component)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    add_cluster_options(p)


def _report_parser(sub) -> None:
    p = _subcommand(sub, "report", help="an HTML page of a run: convergence, component "
                    "pictures, response maps")
    p.add_argument("run_dir", help="a run directory (dkha fit); the page is RUN_DIR/report.html")
    p.add_argument("--components", type=positive_int, default=16,
                   help="components to show (default 16; the page says when there are more)")
    p.add_argument("--maps", metavar="MAPS.zarr",
                   help="response maps from `dkha maps` to show (default: every patch position "
                        "of the training images when their files can be read, else the training "
                        "projections)")
    add_cluster_options(p)


def _maps_parser(sub) -> None:
    p = _subcommand(sub, "maps", help="response maps: every patch position of whole images "
                    "projected on a run's components",
                    description="Cut each image into patches on the training store's grid "
                                "(every position, also for a store ingested with "
                                "--max-samples), project them blockwise on the workers and "
                                "write response (component, image, row, col) to a zarr store.")
    p.add_argument("run_dir", help="a run directory (dkha fit) fitted on image patches")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files (skimage:NAME for scikit-image's bundled ones) or .npy")
    p.add_argument("-o", "--out", required=True, help="the zarr store to write (maps.zarr)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    add_cluster_options(p)


def add_apply_parsers(subparsers) -> None:
    """Add the ``denoise``, ``superresolve`` and ``cluster`` subcommands to ``dkha``'s
    subparsers."""
    p = _subcommand(
        subparsers, "denoise", help="denoise an image (run fitted on its patches) or a data "
        "store of vectors",
        description="Images: cut the image into patches on the training store's grid, project "
                    "them on the components, map them back by a pre-image (--preimage) and "
                    "average the overlapping patches. Data stores (a directory, e.g. NOISY.zarr): "
                    "project and pre-image every sample, blockwise on the cluster (one task per "
                    "chunk), and write the result as a data store.")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="a run directory (dkha fit); without it, the image is denoised by kernel "
                        "PCA of its own patches with every parameter chosen from the noisy "
                        "image by a risk estimate (see 'choice from the noisy image')")
    p.add_argument("image", metavar="INPUT",
                   help="the noisy image (grey or colour; skimage:NAME for bundled ones), or a "
                        "data store (.zarr) of noisy vectors")
    p.add_argument("-o", "--out", required=True,
                   help="where to write the denoised image (8-bit by extension; .tif float, "
                        ".npy) or data store (for a store input)")
    p.add_argument("--reference", metavar="ORIG",
                   help="the clean image (SNR before and after) or clean data store (mean "
                        "squared error before and after); never used to choose anything")
    add_preimage_options(p)
    _choice_options(p)
    _reconstruction_options(p, "patches")

    p = _subcommand(
        subparsers, "superresolve", help="scale an image up with a run fitted on "
        "high-resolution patches (Kim et al. §4.2)",
        description="Scale the low-resolution image up by FACTOR (pixel replication or "
                    "bilinear), cut it into overlapping windows of the training patches' size, "
                    "project them on the components, map them back by a pre-image (--preimage) "
                    "and average the overlaps.")
    p.add_argument("run_dir", help="a run directory fitted on high-resolution patches")
    p.add_argument("image", help="the low-resolution image (skimage:NAME for bundled ones)")
    p.add_argument("--factor", type=positive_int, required=True, metavar="F",
                   help="scale factor (integer)")
    p.add_argument("-o", "--out", required=True,
                   help="where to write the image (8-bit by extension; .tif float, .npy)")
    p.add_argument("--upscaling", choices=("replicate", "bilinear"), default="replicate",
                   help="how the image is first scaled up (default replicate: pixel "
                        "replication, the paper's); the pre-images start from it")
    p.add_argument("--step", dest="window_step", type=positive_int, metavar="S",
                   help="window grid in pixels (default: the training store's step)")
    p.add_argument("--reference", metavar="ORIG",
                   help="the original high-resolution image: print the PSNR")
    add_preimage_options(p, gradient_step="--gradient-step")
    _reconstruction_options(p, "windows")

    p = _subcommand(
        subparsers, "cluster", help="spectral clustering (Ng, Jordan & Weiss) of a run's "
        "training samples",
        description="k-means on the row-normalised projections of the training samples on the "
                    "components; with labels in the store, prints the variation of information "
                    "(nats) and that of random labels.")
    p.add_argument("run_dir", help="a run directory (dkha fit)")
    p.add_argument("-k", "--k", dest="k", type=positive_int, required=True,
                   help="number of clusters")
    p.add_argument("-o", "--out", required=True, help="zarr store for cluster (sample)")
    p.add_argument("--scale", choices=("eigenvectors", "projections"), default="eigenvectors",
                   help="columns as unit eigenvectors (NJW, default) or the raw projections")
    p.add_argument("--seed", type=int, default=0,
                   help="k-means seed, and the random labels' (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_cluster_options(p)


def _reconstruction_options(p: argparse.ArgumentParser, pieces: str) -> None:
    """What every image reconstruction command ends with: blocks, output, where it runs."""
    p.add_argument("--block", type=positive_int, metavar="B",
                   help=f"{pieces} per block (default 2048)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_cluster_options(p)


def _choice_options(p: argparse.ArgumentParser) -> None:
    """``dkha denoise IMAGE`` without a run: the candidates and the rule
    (:func:`dkha.apply.choose.fit_denoise`)."""
    g = p.add_argument_group("choice from the noisy image (no RUN_DIR)")
    g.add_argument("--risk", choices=("auto", "sure", "held-out", "anscombe"),
                   help="the risk estimate that chooses: SURE with the noise level estimated "
                        "from the image (gaussian noise), the held-out-pixel loss (any "
                        "pixel-independent noise), SURE after the generalised Anscombe "
                        "transform (Poisson noise), or auto (default: from the noise model the "
                        "image shows: impulses or speckle held-out, Poisson anscombe, else SURE)")
    g.add_argument("--model", choices=("kernel", "linear"),
                   help="kernel PCA (default) or linear patch PCA under the same rule")
    g.add_argument("--widths", type=float, nargs="+", metavar="W",
                   help="gaussian widths tried, as multiples of the median patch distance "
                        "(default 1.5 3 6 30)")
    g.add_argument("--ranks", type=positive_int, nargs="+", metavar="R",
                   help="numbers of components tried (default 4 6 8 12 16 24 32)")
    g.add_argument("--patch", type=positive_int, metavar="P", help="window side (default 8)")
    g.add_argument("--patch-step", type=positive_int, metavar="S",
                   help="window grid step (default 2)")
    g.add_argument("--samples", type=positive_int, metavar="N",
                   help="training windows, a seeded sample (default 1000)")
    g.add_argument("--seed", type=int, help="the sample's and SURE's probe's seed (default 0)")


def add_preimage_options(p: argparse.ArgumentParser, *, gradient_step: str = "--step") -> None:
    """The pre-image options every reconstruction command shares (:mod:`dkha.apply.preimage`);
    ``gradient_step`` names the gradient step option where ``--step`` means something else."""
    g = p.add_argument_group("pre-images")
    g.add_argument("--preimage", choices=("fixed-point", "conformal", "gradient"),
                   help="fixed-point (Mika et al.; the default for gaussian kernels), conformal "
                        "(Honeine's conformal-map linear solve; any kernel, the default "
                        "otherwise) or gradient (Honeine §5.3; gaussian)")
    g.add_argument("--iterations", type=positive_int, metavar="N",
                   help="fixed-point / gradient iterations per sample, at most (default 50)")
    g.add_argument("--tol", type=float,
                   help="stop a sample once its relative step is below this (default 1e-5)")
    g.add_argument("--eta", type=float,
                   help="conformal: the regularisation η of (P_m − η K_m⁻¹) (default 0; "
                        "η > 0 needs a dictionary run)")
    g.add_argument(gradient_step, dest="step", type=float,
                   help="gradient: a fixed step size, no line search (default: Armijo steps)")
    g.add_argument("--nonnegative", action="store_true",
                   help="gradient: steps weighted by z and iterates kept ≥ 0 (Kallas et al.)")
    g.add_argument("--orthonormalize", action="store_true",
                   help="project with the components' Gram matrix (one more pass; for batch "
                        "runs stopped far from convergence)")
