"""The fit parameters, declared once.

:data:`PARAMETERS` is the one table of the estimators' parameters — name, accepted values (type and
range), default, help — in the manner of scikit-learn's parameter constraints, checked once at the
top of ``fit`` with scikit-learn's wording. Everything that lists fit parameters is generated from
it:

* the estimators' ``__init__`` (signature, stored attributes) and the Parameters section of
  their docstrings (:func:`declare`);
* their validation of the values given (:func:`validate`; what depends on several parameters,
  e.g. the default gain per algorithm, stays in the estimator);
* the ``dkha fit`` / ``dkha tune`` options (:func:`add_options`) and the estimator keywords
  they make (:func:`estimator_kwargs`);
* the keys of a pipeline's ``[[fit]]`` tables (:func:`pipeline_keys`);
* the settings that models fitted together must agree on (:func:`shared_settings`).

A new fit option is one :class:`Param` entry here.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import textwrap
import warnings
from functools import partial
from numbers import Integral, Real

from dkha import algorithms
from dkha.algorithms import ESTIMATOR_FAMILIES
from dkha.data.run_attrs import saved_value
from dkha.errors import ParameterError
from dkha.estimators.param_row import (  # noqa: F401 (the table's vocabulary, importable here)
    BATCH,
    BOTH,
    ONLINE,
    Interval,
    InvalidParameter,
    Options,
    Param,
)
from dkha.names import (
    COLD_MU,
    DEFAULT_MU,
    DEFAULT_XI,
    DEVICES,
    ONLINE_DEFAULT_ETA0,
    ONLINE_DEFAULT_GAMMA,
    ONLINE_DEFAULT_MAX_MEMBERS,
    PRECISIONS,
    config_default,
)

POSITIVE_INT = Interval(Integral, 1, None, "left")
POSITIVE = Interval(Real, 0, None, "neither")
NON_NEGATIVE = Interval(Real, 0, None, "left")
UNIT = Interval(Real, 0, 1, "both")
FINITE = Interval(Real, None, None)
INTEGER = Interval(Integral, None, None)

_ONLINE_GROUP = "online algorithms (on-kha, oo-kha, okpca)"
_GAINS_GROUP = "gains (a list gives one value per model; one value serves all)"

#: every fit parameter of the estimators, in the order of their signatures
PARAMETERS: tuple[Param, ...] = (
    Param("n_components", 8,
          "Number of components ``r``. As in scikit-learn, at most ``min(r, l)`` are returned "
          "and components beyond the rank of ``K'`` are null (eigenvalue 0, projections 0; "
          "``remove_zero_eig`` drops them). ``None``: every component of non-zero eigenvalue "
          "(``l − 1`` are fitted: refused above ``dkha.dense-eigh-limit`` samples).",
          POSITIVE_INT, key="components", cli={"type": "positive_int", "aliases": ["-r"]},
          none=True, doc_type="int or None, default 8", short="number of components r (default 8)",
          saved=True, identity=True),
    Param("algorithm", algorithms.AUTO,
          "``auto``: the exact top components by the fastest path on the machine at hand "
          "(:mod:`dkha.fit.plan`: ``K'`` held whole where it fits ``dkha.dense-bytes``, "
          "otherwise blockwise Krylov from a Nyström start), the choice and its reason in the "
          "attrs ``path`` and ``path_reason``; or one of the paper's algorithms: constant gain "
          "(eq. 8), ``η0 l/(t+l)``, eq. 12 gains, Stochastic Meta-Descent (Algorithm 1) on top "
          "of eq. 12; or the exact top eigenvectors by a block Krylov method (LOBPCG) whose "
          "products are blockwise passes.",
          Options(live=partial(algorithms.names, *ESTIMATOR_FAMILIES[BATCH])), models=(BATCH,),
          shared=False,
          doc_type="{" + ", ".join(f'"{a}"' for a in algorithms.names(*ESTIMATOR_FAMILIES[BATCH]))
          + f'}}, default "{algorithms.AUTO}"',
          short="default auto: the fastest exact path, chosen by a cost model; or one of "
          + ", ".join(a for a in algorithms.names() if a != algorithms.AUTO)
          + "; a comma-separated list of batch algorithms (with --eta0/--mu lists) fits "
          "several models in one pass over the kernel rows, each in "
          "RUN_DIR/<algorithm>[-eta0=V][-mu=V]",
          saved=True, identity=True),
    Param("algorithm", algorithms.AUTO,
          "``auto``: the exact kernel PCA of the samples seen while they all lie in the "
          "dictionary's span (scikit-learn's ``partial_fit`` answers on small streams), then "
          "ON-KHA's update from that state; or one of the papers' algorithms, each running its "
          "update from the first sample: ON-KHA (orthonormalised, Souza Filho & Diniz eqs. "
          "45–50), OO-KHA (orthogonalised, eq. 52) or Honeine's online KPCA (eq. 19, the KHA "
          "rule over the dictionary).",
          Options(live=partial(algorithms.names, *ESTIMATOR_FAMILIES[ONLINE])), models=(ONLINE,),
          shared=False,
          saved=True, identity=True),
    Param("kernel", "gaussian",
          "The kernel (:mod:`dkha.kernels`). scikit-learn's names take scikit-learn's meaning "
          "and defaults: ``rbf`` ``exp(−gamma ‖x−y‖²)`` with ``gamma=None`` meaning "
          "``1/n_features`` (dkha's ``gaussian`` takes ``sigma``, by default the median "
          "distance), ``poly`` ``(gamma x·y + coef0)^degree`` (defaults ``1/n_features``, 1, 3), "
          "``linear``, ``sigmoid`` ``tanh(gamma x·y + coef0)`` (defaults ``1/n_features``, 1), "
          "``cosine``; ``precomputed``: ``X`` is the square kernel matrix (an array, symmetrised "
          "as ``(K + Kᵀ)/2``; or a dask array or data store of a symmetric one, read blockwise), "
          "``transform`` takes ``K(X_new, X_train)``; a callable ``f(x, y, **kernel_params)`` is "
          "evaluated per pair on the workers; a kernel registered with "
          ":func:`dkha.register_kernel` (or a ``dkha.kernels`` entry point) by its name.",
          None, cli={"group": "kernel"},
          doc_type='{kernels}, a registered kernel or callable, default "gaussian"',
          short="gaussian, laplacian, polynomial, sigmoid, cosine; scikit-learn's rbf, poly, "
                "linear (its gamma defaults); a kernel of a dkha.kernels entry point",
          saved=True, identity=True),
    Param("sigma", None,
          "Width of the gaussian / laplacian kernel. ``None`` uses the median distance between "
          "samples (3× it for a gaussian kernel on image patches, ``dkha.patch-sigma-factor``; "
          "recorded in ``kernel_`` and the saved attrs).",
          cli={"type": float, "group": "kernel"}, doc_type="float, optional",
          short="gaussian/laplacian width (default: median distance; 3× on image patches)",
          kernel_param="sigma"),
    Param("degree", None, "Degree of the polynomial kernel (default 1: the dot product).",
          cli={"type": int, "group": "kernel"}, doc_type="int, optional",
          short="polynomial degree (default 1: dot product)", kernel_param="degree"),
    Param("offset", None, "Offset of the polynomial and sigmoid kernels.",
          cli={"type": float, "group": "kernel"}, doc_type="float, optional",
          short="polynomial / sigmoid offset", kernel_param="offset"),
    Param("coef0", None, "scikit-learn's name of ``offset`` (give one of them).",
          models=(BATCH,), flag=None, doc_type="float, optional", kernel_param="coef0"),
    Param("gamma", None,
          "Kernel coefficient, scikit-learn's ``gamma``: ``rbf``/``gaussian`` "
          "``exp(−gamma ‖x−y‖²)`` (instead of ``sigma``), ``poly``/``polynomial`` and "
          "``sigmoid`` the factor of ``x·y``. ``None``: ``1/n_features`` for scikit-learn's "
          "``rbf``, ``poly`` and ``sigmoid``; 1 for dkha's ``polynomial``. The value used is "
          "``gamma_``.", models=(BATCH,), key="kernel_gamma",
          cli={"type": float, "group": "kernel"}, doc_type="float, optional",
          short="kernel coefficient gamma (rbf, poly, sigmoid)", kernel_param="gamma"),
    Param("kernel_params", None, "Keyword arguments of a callable kernel; the parameters of a "
          "named kernel (those of a registered kernel that have no keyword here, e.g. a "
          "Matérn kernel's ``length_scale``).", dict,
          pipeline=False, doc_type="dict, optional",
          cli={"type": "name_values", "metavar": "NAME=VALUE[,NAME=VALUE...]",
               "group": "kernel"},
          short="parameters of a kernel that have no option of their own (a registered "
                "kernel's, e.g. length_scale=2)"),
    Param("kernel_gamma", None,
          "Slope of the sigmoid kernel.",
          models=(ONLINE,), cli={"type": float, "group": "kernel"}, doc_type="float, optional",
          kernel_param="gamma"),
    Param("eta0", None,
          "Base gain, dimensionless: the largest step ``d_i κ̄`` of GHA in feature space before "
          "the decay ``l/(t + l)``, ``κ̄`` the weighted mean squared feature-space norm of the "
          "centered samples (:func:`~dkha.solvers.batch.feature_norm`; stable below about 2 on "
          "any data and kernel). Default from a Nyström start: from the start's eigenvalue "
          "deficit δ (:func:`~dkha.solvers.batch.warm_eta0`: δ/20 for kha-et and kha-smd, at most "
          "0.05; δ/1000 for kha and kha-t); from a random start 0.05 (kha), 0.2 (kha-t), 1 "
          "(kha-et, kha-smd). The applied gains are in the attrs (``eta0_applied``, "
          "``feature_norm``, ``gain`` = η0/κ̄, ``meta_gain`` = μ/κ̄, ``start_deficit``).",
          POSITIVE, models=(BATCH,), shared=False,
          cli={"type": "float_list", "metavar": "ETA0[,ETA0...]", "group": _GAINS_GROUP},
          doc_type="float, optional",
          short="base gain, dimensionless (default: from the start, see README)",
          saved=True, identity=True),
    Param("eta0", ONLINE_DEFAULT_ETA0,
          "Initial step size in units of ``1/κ̄``, ``κ̄ = Σ k(x,x)² / Σ k(x,x)`` on a seeded sample "
          "(1 for the gaussian and laplacian kernels); the applied one is the attr ``gain``.",
          POSITIVE, models=(ONLINE,),
          shared=False, doc_type=f"float, default {ONLINE_DEFAULT_ETA0}",
          saved=True, identity=True),
    Param("mu", None, f"SMD's meta-gain in units of 1/κ̄ (default {DEFAULT_MU} from the Nyström "
          f"start, {COLD_MU} from the random start).",
          NON_NEGATIVE,
          models=(BATCH,), shared=False,
          cli={"type": "float_list", "metavar": "MU[,MU...]", "group": _GAINS_GROUP},
          doc_type="float, optional", short=f"SMD meta-gain (default {DEFAULT_MU}; {COLD_MU} "
          "from --init random)",
          saved=True, identity=True),
    Param("xi", None, f"SMD's decay factor (default {DEFAULT_XI}).", UNIT,
          models=(BATCH,), shared=False, cli={"type": float, "group": _GAINS_GROUP},
          doc_type="float, optional", short=f"SMD decay (default {DEFAULT_XI})",
          saved=True, identity=True),
    Param("rho0", 0.0,
          "SMD's initial log-gain. Algorithm 1 prints ρ0 = 1 (which multiplies every initial "
          "gain by e); ρ0 = 0 converged an order of magnitude lower in our runs.", FINITE,
          models=(BATCH,), shared=False, cli={"type": float, "group": _GAINS_GROUP},
          doc_type="float, default 0.0",
          short="SMD initial log-gain (default 0; the paper's 1 multiplies gains by e)",
          saved=True, identity=True),
    Param("gain_params", None,
          "The hyperparameters of the algorithm's gain rule (its spec's "
          ":class:`~dkha.algorithms.GainRule`, e.g. of an algorithm registered with "
          ":func:`dkha.algorithms.register`) by name; those not given take the rule's defaults. "
          "dkha's own rules take none.", dict,
          models=(BATCH,), shared=False, doc_type="dict, optional",
          cli={"type": "name_values", "metavar": "NAME=VALUE[,NAME=VALUE...]"},
          short="hyperparameters of the algorithm's gain rule (a registered rule's)",
          saved=True, identity=True),
    Param("gain_decay", None,
          "Step-size decay per step, ``η = η0 γ^s`` (Table I, step 17; formerly ``gamma``). "
          f"Default {ONLINE_DEFAULT_GAMMA} when ``tau`` is not given either.",
          Interval(Real, 0, 1, "right"), models=(ONLINE,), shared=False, old="gamma",
          cli={"type": float, "group": _ONLINE_GROUP}, doc_type="float, optional",
          short="learning-rate decay η(k) = γ·η(k−1)",
          saved=True, identity=True),
    Param("tau", None,
          "Honeine's search-then-converge step size ``η = η0 / (1 + s/τ)`` (eq. 20) instead.",
          POSITIVE, models=(ONLINE,), shared=False, cli={"type": float, "group": _ONLINE_GROUP},
          doc_type="float, optional", short="Honeine's η_t = η0 / (1 + t/τ)",
          saved=True, identity=True),
    Param("nu", None,
          "ALD threshold: a sample joins the dictionary when ``ε² = k(x,x) − κᵀK_m⁻¹κ ≥ nu``. "
          "Default: 0.1 × the data's variance in feature space, ``trace(K')/n`` on a seeded "
          "sample (:func:`~dkha.solvers.online.sample_scales`), recorded in the attrs.",
          POSITIVE, models=(ONLINE,), cli={"type": float, "group": _ONLINE_GROUP},
          doc_type="float, optional",
          short="dictionary threshold ν (default 0.1 × the variance in feature space)",
          saved=True, identity=True),
    Param("max_members", ONLINE_DEFAULT_MAX_MEMBERS,
          "Cap on the dictionary (memory ``8 m²`` bytes for the Cholesky factor).",
          POSITIVE_INT, models=(ONLINE,), cli={"type": "positive_int", "group": _ONLINE_GROUP},
          doc_type=f"int, default {ONLINE_DEFAULT_MAX_MEMBERS}",
          short="dictionary size cap",
          saved=True, identity=True),
    Param("eigenvalue_samples", 2000,
          "Rows of a seeded sample of the data on which the eigenvalues (the variance along each "
          "component) and the history's explained variance are measured (all rows when there "
          "are fewer): more is a finer estimate, fewer a cheaper history entry.", POSITIVE_INT,
          models=(ONLINE,), shared=False,
          cli={"type": "positive_int", "metavar": "N", "group": _ONLINE_GROUP},
          doc_type="int, default 2000",
          short="rows the eigenvalues and explained variance are measured on", saved=True),
    Param("center", False,
          "Center in feature space by the running mean in the dictionary's span (Honeine §5.2). "
          "The papers' ON-KHA and OO-KHA are uncentered.", bool, models=(ONLINE,),
          cli={"action": "store_true", "default": None, "negative": "--no-center",
               "group": _ONLINE_GROUP}, doc_type="bool, default False",
          short="center by the running mean in the dictionary's span (Honeine §5.2; default: "
                "uncentered, as the papers' ON-KHA and OO-KHA)",
          saved="centered", identity=True),
    Param("passes", None, "Passes through the data (default 10 when ``steps`` is not given).",
          POSITIVE_INT, models=(BATCH,), cli={"type": "positive_int", "exclusive": "length"},
          doc_type="int, optional", short="passes through the data (default 10)"),
    Param("steps", None,
          "Number of single-sample steps instead of whole passes (online: samples to stream in "
          "``fit``, default one pass and at least 20 000, in passes over small data).",
          POSITIVE_INT,
          cli={"type": "positive_int", "exclusive": "length"}, doc_type="int, optional",
          short="single-sample steps"),
    Param("seed", 0,
          "Seeds the initial coefficients, the sample order and the sigma heuristic's sample.",
          INTEGER, cli={"type": int}, doc_type="int, default 0",
          saved=True, identity=True),
    Param("evaluate_every", 1,
          "Evaluate (eq. 22) every that many passes; 0 only at the end; negative never.", INTEGER,
          models=(BATCH,), cli={"type": int, "metavar": "N"}, doc_type="int, default 1",
          short="evaluate every N passes (0: only at the end; -1: never)"),
    Param("evaluate_every", None,
          "Record a history entry every that many steps (and at the end).", POSITIVE_INT,
          models=(ONLINE,), doc_type="int, optional"),
    Param("block_rows", None,
          "Schedule positions per block of kernel rows (online: samples per block) "
          "(``dkha.block-rows``).", POSITIVE_INT, flag="--block",
          cli={"type": "positive_int", "metavar": "B"}, doc_type="int, optional",
          short=f"rows per block (default {config_default('block-rows')}, dkha.block-rows)"),
    Param("prefetch", None, "Blocks computed (online: read) ahead (``dkha.prefetch``).",
          POSITIVE_INT, cli={"type": "positive_int", "metavar": "D"}, doc_type="int, optional",
          short=f"blocks computed ahead (default {config_default('prefetch')}, dkha.prefetch)"),
    Param("init", None,
          "Initial coefficients. ``None``: the Nyström solution from "
          ":func:`~dkha.solvers.batch.default_landmarks` landmarks (``40 r``, at least 400, at "
          "most ``l − 1`` and as many rows of ``l`` as fill half of ``dkha.memory-budget``; "
          "random for ``algorithm='krylov'``), scaled to unit feature-space norm "
          "(one pass for ``C = A K'``, which also serves the pass-0 evaluation) and refined with "
          "a gain from the start's eigenvalue deficit. ``'random'``: the paper's "
          "``A1 ~ N(0, 1/(r l))``; ``'random:M'``: the same start on ``M`` seeded random "
          "columns, zero elsewhere (KHA/et and SMD then compute ``C = A1 K'`` from ``M`` kernel "
          "rows instead of a pass over all ``l²`` entries: the start for large ``l``); "
          "``'nystrom:M'``: the Nyström solution from ``M`` landmark rows. Recorded in the "
          "history as pass 0 and in the attrs as resolved (e.g. ``'nystrom:640'``). With "
          "``algorithm='krylov'`` the Nyström vectors start the Krylov iteration.",
          str, models=(BATCH,), cli={"metavar": "random|random:M|nystrom:M"},
          doc_type='{None, "random", "random:M", "nystrom:M"}, default None',
          short="initial coefficients: the Nyström solution (default: M = 40·components, at "
                "least 400, at most the samples − 1), random (the paper's), the same on M random "
                "columns (for large data), or nystrom:M",
          saved=True, identity=True),
    Param("tol", None,
          "Stop once an evaluation's excess error ``E/E_min − 1`` is at most ``tol`` "
          "(evaluations every ``evaluate_every`` passes, at least every pass when ``tol`` is "
          "set). For ``algorithm='krylov'``, the relative residual tolerance of the "
          "eigenvectors.", POSITIVE, models=(BATCH,), shared=False, cli={"type": float},
          doc_type="float, optional",
          short="stop once the excess error E/E_min − 1 is at most TOL (krylov: relative "
                "residual tolerance)",
          saved=True),
    Param("projections", None,
          "Where the block projections ``S̃ K'_Pᵀ`` are computed (``dkha.projections``, default "
          "``auto``): on the coordinator from shipped kernel rows, or on the workers from "
          "replicas of the coefficients (coordinator-math.md §4; equal up to rounding, less "
          "traffic; replicas lost with a worker are rebuilt exactly). ``auto`` takes the "
          "workers when they are other processes (a process or remote cluster) and one model "
          "is fitted without the row cache, else the coordinator. The choice and its reason "
          "are in ``timings_['projections']``.",
          Options(("auto", "coordinator", "workers")), models=(BATCH,), cli={"choices": True},
          short="where block projections are computed (dkha.projections, default auto: the "
                "workers when they are other processes): from kernel rows shipped to the "
                "coordinator, or on the workers from replicas"),
    Param("cache_rows", None,
          "Keep the kernel's upper-triangle tiles on the workers (``dkha.row-cache``; about "
          "``4·l²`` bytes, refused above half the workers' memory): kernels are computed once, "
          "not once a pass, which pays from the second pass on (Krylov, many KHA passes, "
          "evaluations). Results equal the uncached run's up to rounding.", bool,
          models=(BATCH,), cli={"action": "store_true", "default": None},
          doc_type="bool, optional",
          short="keep the kernel's upper-triangle tiles in worker memory (about 4·l² bytes): "
                "kernels computed once, not once a pass (dkha.row-cache)"),
    Param("precision", None,
          "The kernel tiles' precision (``dkha.precision``, default float64): ``float32`` runs "
          "the distance GEMM and the fused kernel sweep in single precision (:mod:`dkha.tiles`; "
          "the data shifted by their mean against cancellation) and the coordinator's block "
          "GEMMs on float32 rows; its state, products and evaluation (E, E_min) stay float64.",
          Options(PRECISIONS), models=(BATCH,), cli={"choices": True},
          short="kernel tiles' precision (dkha.precision, default float64); the coordinator's "
                "state and the evaluation stay float64"),
    Param("device", None,
          "Where the workers compute kernel tiles (``dkha.device``, default auto): ``auto`` on "
          "the GPU of the workers that declare a ``GPU`` resource (``dask worker --resources "
          "GPU=1``; the in-process cluster declares its host's GPU where CuPy sees one), the "
          "CPU elsewhere; ``cuda`` on every worker's GPU (CuPy: ``pip install 'dkha[gpu]'``); "
          "``cpu``. On GPU workers the passes are one task per band of tiles with the rows "
          "resident on the device (:mod:`dkha.engine.bandpass`).",
          Options(DEVICES), models=(BATCH,), cli={"choices": True},
          short="where workers compute kernel tiles (dkha.device, default auto: the GPU of "
                "workers with a GPU resource, which the local cluster declares): auto, cpu, "
                "cuda (CuPy, dkha[gpu])"),
    Param("center_sample", None,
          "Estimate the centering row (the MK row) from a seeded sample of this many columns "
          "instead of computing it exactly (an ``O(l² n)`` pass): explicitly approximate, "
          "recorded in the run (attrs ``centering='sample'``, ``center_sample``) and reported "
          "by ``dkha evaluate``. Either row is cached in the data store (``dkha.mk-cache``).",
          POSITIVE_INT, models=(BATCH,), cli={"type": "positive_int", "metavar": "N"},
          doc_type="int, optional",
          short="estimate the centering (MK) row from a seeded sample of N columns instead of "
                "the exact O(l²n) pass: approximate, recorded in the run",
          saved=True, identity=True),
    Param("on_divergence", "backoff",
          "When a step guard trips (non-finite values, a component's feature-space norm or a "
          "gain factor past 10⁶): ``'backoff'`` rolls the fit back to the start of the block "
          "(online: of the slice of samples), halves the gain and goes on (each event in "
          "``backoffs_`` and the saved run's ``backoff_*`` variables; a resume continues bit for "
          "bit); ``'stop'`` raises :class:`~dkha.errors.NumericalError` (exit status 3).",
          Options(("backoff", "stop")), shared=False, cli={"choices": True},
          short="when a step diverges: roll back to the block's start, halve the gain and go on "
                "(backoff, recorded in the run) or stop with exit status 3"),
    Param("client", None,
          "Where the kernel rows are computed (:func:`dkha.engine.cluster.client_for`): a "
          "``distributed.Client`` (used as is), a scheduler address, a number of local worker "
          "processes, a :class:`~dkha.engine.cluster.Where`, or ``None`` "
          "(``DASK_SCHEDULER_ADDRESS``, else an in-process cluster).", models=(BATCH,),
          flag=None, pipeline=False, doc_type="optional"),
    Param("verbose", False, "Show a progress bar.", None, flag=None, shared=False,
          pipeline=False, doc_type="bool, default False"),
    Param("fit_inverse_transform", "preimage",
          "What ``inverse_transform`` does: ``'preimage'`` dkha's pre-images "
          "(:mod:`dkha.apply.preimage`); ``True`` scikit-learn's learned pre-image (Bakır et "
          "al.: kernel ridge regression with the fit's kernel from the training projections "
          "back to the inputs, ridge ``alpha``: a dense solve up to ``dkha.dense-eigh-limit`` "
          "samples, conjugate gradients on blockwise products on the workers above, never "
          "``l × l``, to relative residual ``dkha.ridge-tol``); "
          "``False`` none (``inverse_transform`` raises ``NotFittedError``, as scikit-learn's).",
          Options(("preimage", True, False)), models=(BATCH,), flag=None, pipeline=False,
          doc_type="{'preimage', True, False}, default 'preimage'"),
    Param("alpha", 1.0, "Ridge of the learned pre-image (``fit_inverse_transform=True``); "
          "above ``dkha.dense-eigh-limit`` samples it must be positive (the conjugate "
          "gradients take about ``√(λ_max/alpha)`` products).",
          NON_NEGATIVE, models=(BATCH,), flag=None, pipeline=False,
          doc_type="float, default 1.0"),
    Param("remove_zero_eig", False,
          "Drop the null components (eigenvalue 0 after round-off eigenvalues are clipped to "
          "0): fewer than ``n_components`` may remain. Always on with ``n_components=None``.",
          bool, models=(BATCH,), flag=None, pipeline=False, doc_type="bool, default False"),
    Param("random_state", None,
          "scikit-learn's seed: an int, a ``numpy.random.RandomState`` (one seed is drawn from "
          "it per fit) or ``None`` (``seed`` is used). Outputs do not depend on it beyond the "
          "algorithm's accuracy: component signs follow a fixed convention.",
          None, models=(BATCH,), flag=None, pipeline=False, shared=False,
          doc_type="int, RandomState instance or None, default None"),
    Param("copy_X", True,
          "Keep a copy of an in-memory training array (``X_fit_``); ``False`` keeps the "
          "caller's array, so changing it afterwards changes ``transform``.",
          bool, models=(BATCH,), flag=None, pipeline=False, doc_type="bool, default True"),
)


def parameters(model: str) -> tuple[Param, ...]:
    """The rows of one estimator (``"batch"`` or ``"online"``), in signature order."""
    return tuple(p for p in PARAMETERS if model in p.models)


#: what a run adds to its parameters' identity: the kernel as resolved (e.g. the median-distance
#: sigma), the length in steps, the data
RUN_IDENTITY = ("kernel_parameters", "n_steps", "store")


def identity_attrs(*models: str) -> dict[str, str | None]:
    """The attrs that identify a saved run of ``models`` (both estimators by default), from the
    table's ``identity`` rows and :data:`RUN_IDENTITY`, each with the name older runs saved it
    under (``None``: the same), so that they compare as the same attr."""
    out: dict[str, str | None] = {}
    for p in PARAMETERS:
        if p.identity and set(p.models) & set(models or BOTH):
            out[p.attr] = out.get(p.attr) or p.former_attr
    return {**out, **dict.fromkeys(k for k in RUN_IDENTITY if k not in out)}


def saved_rows(model: str) -> tuple[tuple[str, str], ...]:
    """``(parameter, attr)`` of every saved row of ``model``: what a fit saves, each under its
    attr, with its value as the fit resolved it or, where it resolves none, as the estimator's
    ``get_params`` holds it (:func:`dkha.fit.run_dir.saved_attrs`)."""
    return tuple((p.name, p.attr) for p in parameters(model) if p.attr is not None)


def from_attrs(model: str, attrs: dict, spec) -> dict:
    """The estimator's keywords of ``model`` back from a saved run's ``attrs`` (what
    :func:`dkha.fit.run_dir.saved_attrs` wrote): the saved rows (under their former names in
    runs saved before a rename; attrs an older run lacks are left to the defaults) and the
    kernel's parameters.
    ``spec``: the :class:`~dkha.kernels.KernelSpec` of the run's kernel (``None`` where none
    is registered here); one made from a function, not by name, keeps its parameters (the
    function's name and keywords) out of ``kernel_params``."""
    kernel = attrs.get("kernel_parameters", {})
    out = {p.name: saved_value(attrs, p.attr, p.former_attr) for p in parameters(model)
           if p.attr is not None and (p.attr in attrs or p.former_attr in attrs)}
    rows = {p.name: p.kernel_param for p in parameters(model) if p.kernel_param is not None}
    out.update({name: kernel.get(key) for name, key in rows.items()})
    # a registered kernel's parameters without a row of their own
    rest = {k: v for k, v in kernel.items() if k not in rows.values()}
    if rest and any(p.name == "kernel_params" for p in parameters(model)) \
            and (spec is None or spec.by_name):
        out["kernel_params"] = rest
    return out


def shared_settings(model: str = BATCH) -> tuple[str, ...]:
    """What every model of one shared kernel stream must agree on."""
    return tuple(p.name for p in parameters(model) if p.shared)


def pipeline_keys() -> set[str]:
    """The fit parameters a pipeline's ``[[fit]]`` table may set (beside ``name``,
    ``algorithm``, ``checkpoint_every``)."""
    return {p.dest for p in PARAMETERS if p.pipeline} | {p.old for p in PARAMETERS
                                                        if p.pipeline and p.old}


# --- the estimators ------------------------------------------------------------------------------


def _signature(model: str) -> inspect.Signature:
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for i, p in enumerate(parameters(model)):
        kind = (inspect.Parameter.POSITIONAL_OR_KEYWORD if i == 0
                else inspect.Parameter.KEYWORD_ONLY)
        params.append(inspect.Parameter(p.name, kind, default=p.default))
    return inspect.Signature(params)


def _doc_type(p: Param) -> str:
    """The docstring type of a row without one: its options and default."""
    if isinstance(p.accepts, Options):
        values = "{" + ", ".join(f'"{v}"' if isinstance(v, str) else repr(v)
                                 for v in p.accepts.choices) + "}"
        return values + (", optional" if p.default is None else f', default "{p.default}"'
                         if isinstance(p.default, str) else f", default {p.default!r}")
    return "optional"


def _docs(model: str, kernels: tuple[str, ...]) -> str:
    out = []
    names = "{" + ", ".join(f'"{k}"' for k in kernels) + "}"
    for p in parameters(model):
        out.append(f"    {p.name} : {(p.doc_type or _doc_type(p)).replace('{kernels}', names)}")
        out += textwrap.wrap(p.help, 96, initial_indent=" " * 8, subsequent_indent=" " * 8,
                             break_long_words=False, break_on_hyphens=False)
    return "\n".join(out)


def declare(model: str, kernels: tuple[str, ...]):
    """Class decorator: the estimator's ``__init__`` (it only stores the parameters, as
    scikit-learn's do; ``n_components`` may be positional, the rest are keyword-only) and the
    ``{parameters}`` of its docstring, from :data:`PARAMETERS`; ``kernels``: the kernel names
    it lists (:func:`dkha.kernels.kernel_names`, which this module, imported by the command
    line's light paths, does not import)."""
    sig = _signature(model)

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **renamed(kwargs, model, f"{type(self).__name__}("))
        bound.apply_defaults()
        for name, value in list(bound.arguments.items())[1:]:
            setattr(self, name, value)

    __init__.__signature__ = sig

    def wrap(cls):
        __init__.__qualname__ = f"{cls.__name__}.__init__"
        cls.__init__ = __init__
        cls._table = model
        if cls.__doc__ and "{parameters}" in cls.__doc__:
            cls.__doc__ = cls.__doc__.replace("{parameters}", _docs(model, kernels).lstrip())
        return cls

    return wrap


def renamed(values: dict, model: str, where: str) -> dict:
    """``values`` with each row's former name (:attr:`Param.old`) replaced by its own, with a
    ``FutureWarning``. ``where``: ``"--"`` (command-line keys), ``""`` (pipeline keys) or
    ``"Class("`` (the estimator's keywords)."""
    by_name = where.endswith("(")
    mine = {p.name if by_name else p.dest for p in parameters(model)}
    out = dict(values)
    for p in parameters(model):
        if not p.old or p.old in mine or p.old not in out:
            continue
        value = out.pop(p.old)
        if value is None:
            continue
        key = p.name if by_name else p.dest
        if where == "--":
            old, new = "--" + p.old.replace("_", "-"), "--" + key.replace("_", "-")
        elif by_name:
            old, new = f"{where}{p.old}=...)", f"{key}"
        else:
            old, new = f"the [[fit]] key {p.old}", key
        warnings.warn(f"{old} is now {new}; the old spelling will be removed", FutureWarning,
                      stacklevel=3)
        if out.get(key) is not None:
            raise ParameterError(f"give {new} or {old}, not both")
        out[key] = value
    return out


def validate(estimator, model: str) -> None:
    """Check every parameter's value against its row (type and range), once at the top of
    ``fit``; raises :class:`InvalidParameter` naming the first bad one in scikit-learn's words."""
    for p in parameters(model):
        p.check(getattr(estimator, p.name), type(estimator).__name__)


def recorded_params(estimator, model: str) -> dict:
    """The parameters of ``estimator`` (a ``model`` estimator) that the command line gives, as
    the estimator holds them (unresolved: a default left ``None`` stays ``None``), JSON values
    only (numbers, strings, and ``NAME=VALUE`` options' dicts of them): what its checkpoints
    record, so that a bare ``dkha fit DATA -o RUN --resume`` continues the run as it was asked
    for (:func:`dkha.cli.fit.resumed_options`)."""
    simple = (bool, int, float, str)
    out = {}
    for p in parameters(model):
        v = getattr(estimator, p.name, None)
        dict_of_simple = isinstance(v, dict) and all(isinstance(x, simple) for x in v.values())
        if p.option is None or not (v is None or isinstance(v, simple) or dict_of_simple):
            continue
        out[p.name] = v
    return out


def request_values(estimator, model: str, request) -> dict:
    """``{name: value}`` of each row of ``model`` that the typed ``request`` (a dataclass) has a
    field of, as ``estimator`` holds it, of the row's type (:meth:`Param.resolved`): what a
    request takes from the table as it is, so that such a setting is declared once, a row and a
    field of the same name."""
    names = {f.name for f in dataclasses.fields(request)}
    return {p.name: p.resolved(getattr(estimator, p.name)) for p in parameters(model)
            if p.name in names}


def kernel_values(estimator, model: str) -> dict:
    """The kernel's parameters as ``estimator`` holds them (resolved on the data by the fit):
    each ``kernel_param`` row's value under that parameter's name, and ``kernel_params``."""
    return {**{p.kernel_param: getattr(estimator, p.name) for p in parameters(model)
               if p.kernel_param is not None}, "kernel_params": estimator.kernel_params}


def get_params(estimator, model: str) -> dict:
    return {p.name: getattr(estimator, p.name) for p in parameters(model)}


# --- the command line ----------------------------------------------------------------------------


def add_options(parser, model_kinds=BOTH, *, types: dict, skip=(), defaults: dict | None = None,
                groups: dict | None = None) -> None:
    """Add one command-line option per distinct key of the rows of ``model_kinds`` (skipping the
    keys in ``skip``; ``defaults`` overrides option defaults by key). ``types`` maps the names of
    the command line's argument types (``"positive_int"``, ``"float_list"``) to functions."""
    defaults = defaults or {}
    groups = {} if groups is None else groups
    exclusive: dict = {}
    seen = set()
    for p in PARAMETERS:
        if p.option is None or p.dest in seen or p.dest in skip or \
                not set(p.models) & set(model_kinds):
            continue
        seen.add(p.dest)
        extra = dict(p.cli)
        group_name = extra.pop("group", None)
        aliases = extra.pop("aliases", [])
        negative = extra.pop("negative", None)
        excl = extra.pop("exclusive", None)
        if isinstance(extra.get("type"), str):
            extra["type"] = types[extra["type"]]
        if extra.get("choices") is True:        # the table's options, never re-listed
            extra["choices"] = p.accepts.choices
        extra.setdefault("default", p.default)
        if p.dest in defaults:
            extra["default"] = defaults[p.dest]
        short = p.short if p.short is not None else p.help.split(". ")[0].rstrip(".")
        shown = extra["default"]
        if shown is not None and shown is not False and "default" not in short:
            # the table's default, never re-listed
            short = (short[:-1] + f"; default {shown})" if short.endswith(")")
                     else short + f" (default {shown})")
        extra["help"] = short
        if excl is not None:
            if excl not in exclusive:
                exclusive[excl] = parser.add_mutually_exclusive_group()
            target = exclusive[excl]
        elif group_name is not None:
            if group_name not in groups:
                groups[group_name] = parser.add_argument_group(group_name)
            target = groups[group_name]
        else:
            target = parser
        target.add_argument(p.option, *aliases, dest=p.dest, **extra)
        if negative:
            target.add_argument(negative, dest=p.dest, action="store_false",
                                default=extra["default"], help=f"the opposite of {p.option}")
        if p.old:       # the former spelling, hidden (a FutureWarning where it is used)
            target.add_argument("--" + p.old.replace("_", "-"), dest=p.old, type=extra.get("type"),
                                default=None, help=argparse.SUPPRESS)


def estimator_kwargs(values: dict, model: str, algorithm: str, *, where: str = "--") -> dict:
    """The keywords of a ``model`` estimator from command-line or pipeline ``values`` (by key).

    Unset values (``None``) are left to the estimator's defaults. A key that only the other
    estimator takes must be unset or at that estimator's default, otherwise the one-line error
    names it (``where`` prefixes the key: ``"--"`` for options, ``""`` for pipeline keys)."""
    mine = {p.dest: p for p in parameters(model)}
    values = renamed(values, model, where)
    out = {}
    for key, value in values.items():
        if key in mine:
            if value is not None:
                out[mine[key].name] = value
            continue
        other = [p for p in PARAMETERS if key in (p.dest, p.old)]
        if other and value is not None and value != other[0].default:
            if model == BATCH:
                online = (a for a in algorithms.names(algorithms.ONLINE)    # auto: batch here
                          if algorithms.family(a) == algorithms.ONLINE)
                kinds = f"online algorithms ({', '.join(online)})"
            else:
                kinds = "batch algorithms"
            name = where + (key.replace("_", "-") if where == "--" else key)
            raise ParameterError(f"{name} applies to the {kinds}, not {algorithm}")
    return out


def cli_values(args, model_kinds=BOTH) -> dict:
    """``{key: value}`` of every table option present in parsed ``args``."""
    out = {p.dest: getattr(args, p.dest) for p in PARAMETERS
           if p.option is not None and set(p.models) & set(model_kinds)
           and hasattr(args, p.dest)}
    out.update({p.old: getattr(args, p.old) for p in PARAMETERS
                if p.old and p.option is not None and hasattr(args, p.old)})
    return out
