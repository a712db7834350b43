"""The row engine: MK row, centered row blocks, blockwise products, the block stream.

Every result is checked against the dense ``K' = K − 1K/l − K1/l + 1K1/l²`` computed in NumPy
(kernel by ``scipy.spatial`` distances, centering with explicit ones-matrices).
"""

from __future__ import annotations

import numpy as np
import pytest

from dkha import config
from dkha.data.ingest import ingest_array
from dkha.engine.rows import RowEngine
from dkha.engine.tasks import block_rows, center_block
from dkha.kernels import make_kernel

SIGMA = 4.0
REL = 1e-12


def assert_rel(got, want, tol=REL, scale=None):
    """``max|got − want| ≤ tol · scale`` (scale: ``max|want|`` unless given)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    scale = np.abs(want).max() if scale is None else scale
    err = np.abs(got - want).max()
    assert err <= tol * scale, f"max error {err:.3e} > {tol:g} × {scale:.3e}"


@pytest.fixture(scope="module")
def stores(tmp_path_factory, digits):
    """The digits in chunks of 17 (18 chunks), 64 (5) and 300 rows (one chunk)."""
    base = tmp_path_factory.mktemp("rows")
    return {c: ingest_array(np.array(digits), base / f"c{c}.zarr", chunk_rows=c)
            for c in (17, 64, 300)}


@pytest.fixture(scope="module")
def oracle(digits, dense_centered):
    return {"gaussian": dense_centered(digits, "gaussian", sigma=SIGMA),
            "polynomial": dense_centered(digits, "polynomial", degree=2, offset=1.0)}


def kernel_of(name):
    return (make_kernel("gaussian", sigma=SIGMA) if name == "gaussian"
            else make_kernel("polynomial", degree=2, offset=1.0))


LAYOUTS = [(17, 1), (17, 3), (64, 2), (64, 5), (300, 1), (300, 2)]


@pytest.mark.parametrize("chunk,groups", LAYOUTS)
@pytest.mark.parametrize("name", ["gaussian", "polynomial"])
def test_mk_row(stores, oracle, client, chunk, groups, name):
    K, _ = oracle[name]
    engine = RowEngine(stores[chunk], kernel_of(name), client,
                       config.settings(column_groups=groups))
    mk, mkm = engine.compute_mk(cache=False)   # the pass itself, in every layout
    assert_rel(mk, K.mean(axis=0))
    assert mkm == pytest.approx(K.mean(), rel=REL)
    assert engine.mk is mk or np.array_equal(engine.mk, mk)


def check_rows_and_products(engine, Kc, rng):
    """Rows (any order, repeats, both ends), the dense K', K'V and the residuals against Kc."""
    l = len(Kc)
    idx = np.concatenate([[299, 0], rng.choice(l, size=37), [5, 5]])
    assert_rel(engine.rows(idx), Kc[idx])
    assert_rel(engine.dense(), Kc)
    V = rng.normal(size=(l, 3))
    assert_rel(engine.matmat(V), Kc @ V, scale=(np.abs(Kc) @ np.abs(V)).max())
    C = rng.normal(size=(4, l)) * 0.05
    frob2, res2 = engine.residual(C)
    assert frob2 == pytest.approx(np.sum(Kc**2), rel=REL)
    assert res2 == pytest.approx(np.sum((Kc - C.T @ C) ** 2), rel=REL)
    return idx


@pytest.mark.parametrize("chunk,groups", LAYOUTS)
def test_centered_rows_dense_products(stores, oracle, client, chunk, groups, seed):
    engine = RowEngine(stores[chunk], kernel_of("gaussian"), client,
                       config.settings(column_groups=groups))
    check_rows_and_products(engine, oracle["gaussian"][1], np.random.default_rng(seed))


@pytest.mark.parametrize("chunk", [17, 64, 300])
def test_row_cache(stores, oracle, client, chunk, seed):
    """The cached-tile path (``cache_rows``) gives the same MK row, rows, products and residuals;
    the stream delivers rows in order; the cache can be released and rebuilt."""
    K, Kc = oracle["gaussian"]
    l = len(Kc)
    engine = RowEngine(stores[chunk], kernel_of("gaussian"), client,
                       config.settings(row_cache=True), prefetch=3)
    mk, _mkm = engine.compute_mk(cache=False)  # from the tiles' sums, not a cached row
    assert_rel(mk, K.mean(axis=0))
    assert engine.cache_bytes() >= 8 * l * (l + 1) // 2
    rng = np.random.default_rng(seed)
    blocks = [(k, rng.permutation(l)[:50]) for k in range(6)]
    for (tag, i, rows), (want_tag, want_i) in zip(engine.stream(blocks), blocks):
        assert tag == want_tag and np.array_equal(i, want_i)
        assert_rel(rows, Kc[want_i])
    idx = check_rows_and_products(engine, Kc, rng)
    engine.release_cache()
    assert_rel(engine.rows(idx[:5]), Kc[idx[:5]])


def test_row_cache_refused_when_too_big(stores, client, monkeypatch):
    from dkha.engine.tilecache import TileCache
    from dkha.errors import ParameterError

    monkeypatch.setattr(TileCache, "nbytes", lambda self: 2**60)
    with pytest.raises(ParameterError, match="row cache needs"):
        RowEngine(stores[64], kernel_of("gaussian"), client, config.settings(row_cache=True))


def test_residual_near_the_optimum(stores, oracle, client):
    """With C from the top eigenpairs the residual is the tail ‖K'‖² − Σ λ_i²."""
    _, Kc = oracle["gaussian"]
    w, V = np.linalg.eigh(Kc)
    C = (V[:, -5:] * np.sqrt(w[-5:])).T
    engine = RowEngine(stores[64], kernel_of("gaussian"), client, config.settings(column_groups=2))
    frob2, res2 = engine.residual(C)
    tail = np.sum(w[:-5] ** 2)
    assert res2 == pytest.approx(tail, rel=1e-9)
    assert frob2 == pytest.approx(np.sum(w**2), rel=REL)


def test_polynomial_rows(stores, oracle, client):
    _, Kc = oracle["polynomial"]
    engine = RowEngine(stores[17], kernel_of("polynomial"), client,
                       config.settings(column_groups=4))
    idx = np.arange(0, 300, 7)[::-1]
    assert_rel(engine.rows(idx), Kc[idx])
    assert_rel(engine.dense(), Kc)


def test_center_block(oracle, seed):
    K, Kc = oracle["gaussian"]
    rng = np.random.default_rng(seed)
    P, J = rng.choice(300, 9, replace=False), rng.choice(300, 13, replace=False)
    mk, mkm = K.mean(axis=0), K.mean()
    got = center_block(K[np.ix_(P, J)].copy(), mk[P], mk[J], mkm)
    assert_rel(got, Kc[np.ix_(P, J)])


def test_set_mk_is_used(stores, oracle, client):
    """Rows centered with a given mk (as transform does) use it, not a recomputed one."""
    K, Kc = oracle["gaussian"]
    engine = RowEngine(stores[64], kernel_of("gaussian"), client, config.settings(column_groups=2))
    mk = K.mean(axis=0) + 0.25
    engine.set_mk(mk, K.mean() + 0.5)
    idx = np.array([3, 200])
    # K'[P, J] = K − mk[J] − mk[P] + mkm with the shifted mk: −0.25 − 0.25 + 0.5 = 0
    assert_rel(engine.rows(idx), Kc[idx])
    engine.set_mk(mk, K.mean())
    assert_rel(engine.rows(idx), Kc[idx] - 0.5)


def new_samples(K, digits, seed, n):
    """``n`` noisy copies of digits, random coefficients ``alpha`` (3 × 300) and the dense
    oracle of the new samples' centered kernel rows against the training digits (``K`` theirs)."""
    from scipy.spatial.distance import cdist

    rng = np.random.default_rng(seed)
    Xnew = digits[rng.choice(300, n)] + 0.1 * rng.normal(size=(n, 64))
    alpha = rng.normal(size=(3, 300))
    Knew = np.exp(-cdist(Xnew, digits, "sqeuclidean") / (2 * SIGMA**2))
    return Xnew, alpha, Knew - K.mean(axis=0)[None, :] - Knew.mean(axis=1)[:, None] + K.mean()


def test_transform_new_samples(stores, oracle, digits, client, seed):
    K, _ = oracle["gaussian"]
    engine = RowEngine(stores[17], kernel_of("gaussian"), client, config.settings(column_groups=3))
    engine.compute_mk()
    Xnew, alpha, Kc_new = new_samples(K, digits, seed, 6)
    want = Kc_new @ alpha.T
    assert_rel(engine.transform(Xnew, alpha), want, scale=(np.abs(Kc_new) @ np.abs(alpha.T)).max())


def test_a_projection_task_holds_a_bounded_block_of_kernel_rows(stores, oracle, digits,
                                                                  monkeypatch, seed):
    """``project_rows`` (a transform task) holds ``PROJECTION_BYTES`` of kernel rows of the new
    samples at a time, not its whole chunk's rows against every training sample (a chunk of
    2 048 new samples against 100 000 training ones: 1.6 GB a thread; `dkha transform` peaked
    at twice the fit's memory, issue 43); its projections are the dense oracle's all the same."""
    from dkha.engine import tasks

    K, _ = oracle["gaussian"]
    Xnew, alpha, Kc_new = new_samples(K, digits, seed, 23)
    want = Kc_new @ alpha.T
    store = stores[64]
    groups = tuple((store.chunk_bounds(i),) for i in range(store.n_chunks))
    kernel = kernel_of("gaussian")

    rows = []

    class Recorded:             # the kernel, recording the rows of new samples of each block
        def block(self, X, Y):
            rows.append(len(X))
            return kernel.block(X, Y)

    monkeypatch.setattr(tasks, "PROJECTION_BYTES", 5 * 300 * 8)     # 5 rows of 300 columns
    got = tasks.project_rows(str(store.path), Recorded(), Xnew, K.mean(axis=0), K.mean(),
                             groups, alpha)
    assert max(rows) == 5 and sum(rows) == 23 * len(groups)
    assert_rel(got, want, scale=(np.abs(Kc_new) @ np.abs(alpha.T)).max())


@pytest.mark.parametrize("path", ["rows", "dense", "transform", "diagonal"])
def test_direct_paths_wait_through_the_stop_checks(stores, oracle, digits, client, path):
    """``rows()``, ``dense()``, ``transform()`` and the centered diagonal wait for their tasks
    through the passes' plumbing (:mod:`dkha.engine.passes`): a stop request ends each with
    :class:`Interrupted` naming what it stopped, and once cleared the same call gives the rows."""
    from dkha.engine.stop import STOP
    from dkha.errors import Interrupted

    _K, Kc = oracle["polynomial"]
    engine = RowEngine(stores[64], kernel_of("polynomial"), client,
                       config.settings(column_groups=2))
    engine.compute_mk(cache=False)
    idx = np.array([7, 0, 299])
    calls = {"rows": (lambda: engine.rows(idx), "the rows of 3 samples", lambda: Kc[idx]),
             "dense": (engine.dense, "the dense tile", lambda: Kc),
             "transform": (lambda: engine.transform(digits[idx], np.eye(300)[:2]),
                           "the projection of 3 new samples", lambda: Kc[idx][:, :2]),
             "diagonal": (engine.centered_diagonal, "the kernel's diagonal", lambda: np.diag(Kc))}
    call, what, want = calls[path]
    STOP.set()
    try:
        with pytest.raises(Interrupted, match=f"stopped during {what}"):
            call()
    finally:
        STOP.clear()
    assert_rel(call(), want())


@pytest.mark.parametrize("prefetch", [1, 3])
def test_stream_in_order(stores, oracle, client, prefetch, seed):
    _, Kc = oracle["gaussian"]
    engine = RowEngine(stores[17], kernel_of("gaussian"), client,
                       config.settings(column_groups=2), prefetch=prefetch)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(300)
    blocks = [(("block", k), perm[a:a + 23]) for k, a in enumerate(range(0, 300, 23))]
    pulled = []

    def source():
        for b in blocks:
            pulled.append(b[0])
            yield b

    seen = []
    for k, (tag, idx, rows) in enumerate(engine.stream(source())):
        # bounded look-ahead: never more than `prefetch` blocks requested beyond those yielded
        assert len(pulled) <= k + prefetch
        if k == 0:
            assert len(pulled) == prefetch  # it does compute ahead
        seen.append(tag)
        np.testing.assert_array_equal(idx, blocks[k][1])
        assert_rel(rows, Kc[blocks[k][1]])
    assert seen == [b[0] for b in blocks]
    assert engine.stats.blocks == len(blocks) and engine.stats.rows == 300
    assert engine.stats.bytes_received == 300 * 300 * 8


def test_stream_closed_early(stores, oracle, client):
    _, Kc = oracle["gaussian"]
    engine = RowEngine(stores[64], kernel_of("gaussian"), client,
                       config.settings(column_groups=2), prefetch=3)
    blocks = [(k, np.arange(k * 30, k * 30 + 30)) for k in range(10)]
    gen = engine.stream(iter(blocks))
    tag, idx, rows = next(gen)
    assert tag == 0
    assert_rel(rows, Kc[idx])
    gen.close()  # cancels the blocks computed ahead
    # the engine still serves rows afterwards
    assert_rel(engine.rows(np.array([299])), Kc[[299]])
    assert list(engine.stream(iter([]))) == []


def test_chunk_cache_sees_a_store_written_again(tmp_path, digits):
    """A store replaced at the same path (``ingest --overwrite``) is not served from the
    per-process chunk cache of the old one."""
    from dkha.engine.tasks import load_rows

    X = np.array(digits[:100])
    path = str(tmp_path / "again.zarr")
    ingest_array(X, path, chunk_rows=50)
    np.testing.assert_array_equal(load_rows(path, 0, 50), X[:50])
    ingest_array(X + 1.0, path, chunk_rows=50, overwrite=True)
    np.testing.assert_array_equal(load_rows(path, 0, 50), X[:50] + 1.0)


@pytest.mark.parametrize("hold", [None, 1])
def test_band_sums_on_the_workers(stores, oracle, client, monkeypatch, hold):
    """The MK row and ``K'V`` are summed band by band on the workers: the same bits as the
    straightforward form (every tile's pieces gathered and added on the coordinator in the
    pass's order), whatever the fan-in (``hold=1``: one add task a piece), with one band of
    each sum coming home."""
    from dkha.engine import passes
    from dkha.engine.tasks import mk_tile, product_pair

    if hold is not None:
        monkeypatch.setattr(passes, "REDUCE_HOLD_BYTES", hold)
    store = stores[17]
    engine = RowEngine(store, kernel_of("gaussian"), client, config.settings())
    g, pairs, l = engine.tile_groups, engine.tile_pairs(), store.n_samples
    n = len(g)
    assert n >= 3
    bounds = [(t[0][0], t[-1][1]) for t in g]

    mk, _mkm = engine.compute_mk(cache=False)
    want = np.zeros(l)
    for i, j in pairs:
        colsum, rowsum = mk_tile(store.path, engine.kernel, g[i], g[j])
        want[slice(*bounds[j])] += colsum
        if rowsum is not None:
            want[slice(*bounds[i])] += rowsum
    assert np.array_equal(mk, want / l)
    K, _ = oracle["gaussian"]
    assert_rel(mk, K.mean(axis=0))

    V = np.random.default_rng(3).normal(size=(l, 5))
    got = engine.matmat(V)
    want = np.zeros((l, 5))
    for i, j in pairs:
        to_i, to_j = product_pair(store.path, engine.kernel, engine.mk, engine.mkm, g[i], g[j], V)
        want[slice(*bounds[i])] += to_i
        if to_j is not None:
            want[slice(*bounds[j])] += to_j
    assert np.array_equal(got, want)
    Kc = oracle["gaussian"][1]
    assert_rel(got, Kc @ V, scale=(np.abs(Kc) @ np.abs(V)).max())

    mk_pass, product = [p for p in engine.stats.passes if p["kind"] in ("mk", "product")]
    assert product["bytes_received"] == l * 5 * 8 and mk_pass["bytes_received"] == l * 8
    pieces = 2 * len(pairs) - n
    for p in (mk_pass, product):
        assert p["tasks"] == len(pairs)
        assert p["reduce_tasks"] == (pieces if hold else n), p
        width = 5 if p is product else 1
        assert p["fan_in"] == (1 if hold else passes.REDUCE_HOLD_BYTES // (2 * l * width * 8))


def test_a_stop_mid_product_leaves_the_scheduler_quiet(stores, client, monkeypatch):
    """A stop in the middle of a ``K'V`` pass lets go of its tasks without an error on the
    scheduler. Cancelling them did not: with one add task a piece, a band's chain of partial
    sums holds tasks the client no longer wants, and cancelling a product cancels those too,
    so cancelling the band's last partial afterwards tripped ``assert ts.who_wants``
    ("Exception while handling op register-client", "Task exception was never retrieved")."""
    from dkha.engine import passes
    from tests.stops import stop_mid_pass_quietly

    monkeypatch.setattr(passes, "REDUCE_HOLD_BYTES", 1)      # fan-in 1: chains of partials
    engine = RowEngine(stores[17], kernel_of("gaussian"), client, config.settings())
    engine.compute_mk(cache=False)
    V = np.random.default_rng(0).normal(size=(300, 6))
    n = len(engine.tile_pairs())
    stop_mid_pass_quietly(engine, V, monkeypatch, range(3, n, max(1, n // 12)))


def test_float32_rows_come_in_one_task_a_block_with_the_layouts_bits(stores, oracle, client):
    """Float32 tiles shift by their column group's mean, so a float32 block keeps the layout's
    column groups (the fit's bits, whatever the cluster); on 2 threads with 4 blocks in flight
    its rows still come from one task, each group tiled on its own (not one task a group, whose
    pieces the coordinator joined: a float32 KHA-SMD pass took 5.4 s against 3.4 s at l = 20 000,
    2 cores)."""
    _, Kc = oracle["gaussian"]
    engine = RowEngine(stores[17], kernel_of("gaussian"), client,
                       config.settings(precision="float32"), prefetch=4)
    kernel = engine.kernel
    idx = np.random.default_rng(3).permutation(300)[:23]
    futures = engine.submit_rows(idx)
    assert len(engine.column_groups) == 4 and len(futures) == 1
    rows = futures[0].result()
    by_group = [block_rows(engine.source, engine.all_ranges, kernel, engine.mk, engine.mkm, idx, g)
                for g in engine.column_groups]
    np.testing.assert_array_equal(rows, np.concatenate(by_group, axis=1))
    assert rows.dtype == np.float32
    assert_rel(rows, Kc[idx], tol=1e-5)
