"""The default policy's per-row arithmetic compiled (numba), one call per stage instead of a
dozen numpy calls: at 256 instances a numpy call costs about as much as its arithmetic
(1–3 µs each, mostly call overhead), and the bounded-load guard and the marginal-latency
scorer were ~25 of them a decision.

    spread_runs(masks, counts, size)                           → hit in blocks per slot
    prefix_rows(blocks, n, B, plen, most, queued, hit, new, p)  fills hit, new, P in place
    bounded_load(load, queued, hit, new, cand, c, sticky)      → (keep, sticky_used)
    marginal_cost(new, queued, absorb, load, running, cand)    → (cost, tiebreak)
    argmin_tied(scores, tiebreak, last_chosen, cand)           → the rows still tied

The formulas are the ones services/router/index.py (the runs' count), core.py (hit, new, P),
policies/latency.py and pipeline.py's ArgminPicker state; these loops compute
them candidate by candidate with the same IEEE operations in the same order as the numpy
expressions they replace (int64 → float64 where an int meets a float, exact below 2⁵³; no
fused multiply-add: numba compiles without fast-math), so every decision is bit-identical —
pinned by tests/test_router_kernels.py against the numpy expressions, by the golden decisions
(tests/test_router_decisions.py) and by bench.decision_paired's equality check.

Columns are passed whole (FleetView's arrays) with `cand`, the candidate rows, so no gather is
made before the call. Each kernel has one signature, compiled by `load()` (the first time
after a change to this file: a few seconds) or loaded from numba's cache (`cache=True`:
__pycache__ beside this file). The `_name` functions are the plain Python they compile from.
"""

from __future__ import annotations

import math

import numpy as np

KERNELS = ("spread_runs", "prefix_rows", "bounded_load", "marginal_cost", "argmin_tied")


def load() -> None:
    """Compile the kernels (or load them from numba's cache) and bind them in this module.
    RouterCore's constructor calls it, so a process that never routes (a worker, the CLI)
    never imports numba (~0.5–1 s), and no request pays for compiling; an attribute read
    before it loads them too (PEP 562's module __getattr__)."""
    if all(name in globals() for name in KERNELS):
        return
    from numba import njit, types

    # Read-only array types for what a kernel only reads: a writable array is passed to them
    # as it is, so each kernel has one signature, and FleetView.every_row's read-only
    # candidates need no second one.
    i, f = (types.Array(t, 1, "C", readonly=True) for t in (types.int64, types.float64))
    ia, fa = (types.Array(t, 1, "A", readonly=True) for t in (types.int64, types.float64))
    i_out, f_out, b_out = (types.Array(t, 1, "C") for t in (types.int64, types.float64, types.boolean))
    u8 = types.Array(types.uint8, 1, "C", readonly=True)
    signatures = {
        "spread_runs": i_out(u8, i, types.int64),
        "prefix_rows": types.none(ia, types.int64, types.int64, types.int64, types.int64, f, i_out, i_out, f_out),
        "bounded_load": types.Tuple((b_out, types.boolean))(i, f, i, i, ia, types.float64, types.boolean),
        "marginal_cost": types.Tuple((f_out, f_out))(i, f, f, i, i, ia),
        "argmin_tied": i_out(fa, fa, i, ia),
    }
    for name, signature in signatures.items():
        python = globals()["_" + name]
        try:  # machine code cached where numba finds a writable place (__pycache__, NUMBA_CACHE_DIR)
            compiled = njit(signature, cache=True, nogil=True)(python)
        except RuntimeError:  # "cannot cache function …": a read-only install, compiled per process
            compiled = njit(signature, nogil=True)(python)
        globals()[name] = compiled


def __getattr__(name: str):
    if name in KERNELS:
        load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _spread_runs(masks: np.ndarray, counts: np.ndarray, size: int) -> np.ndarray:
    """BlockIndex._counts: hit(s) = Σ_r counts[r] × bit s of run r's mask, for slots 0…size−1;
    the masks are little-endian byte strings, one after the other, (size + 7) // 8 bytes each.
    Zero bytes are skipped (a run's holders are a few of the slots, or all of them)."""
    out = np.zeros(size, dtype=np.int64)
    nbytes = (size + 7) // 8
    for r in range(len(counts)):
        count = counts[r]
        base = r * nbytes
        for b in range(nbytes):
            v = masks[base + b]
            if v:
                for bit in range(8):
                    if v >> bit & 1:
                        out[8 * b + bit] += count
    return out


def _prefix_rows(
    blocks: np.ndarray, n: int, block: int, plen: int, most: int,
    queued: np.ndarray, hit: np.ndarray, new: np.ndarray, p: np.ndarray,
) -> None:
    """RouterCore.route's per-row inputs from r's cached blocks on rows 0…n−1 (`blocks` empty:
    r's first block is held nowhere, every hit is 0):

        hit = min(blocks · B, len),  new = max(len − hit, 1),  P = Q + new

    A row's blocks never exceed the chain's, so each bound can bind only where the chain
    reaches the prompt's end (`most` = chain blocks · B against len): the others are skipped."""
    none = len(blocks) == 0
    cap_hit = most > plen and not none
    cap_new = most >= plen or none
    for i in range(n):
        h = 0 if none else blocks[i] * block
        if cap_hit and h > plen:
            h = plen
        w = plen - h
        if cap_new and w < 1:
            w = 1
        hit[i] = h
        new[i] = w
        p[i] = queued[i] + w


def _bounded_load(
    load: np.ndarray, queued: np.ndarray, hit: np.ndarray, new: np.ndarray, cand: np.ndarray, c: float, sticky: bool
) -> tuple[np.ndarray, bool]:
    """BoundedLoadGuard's mask over `cand` and whether the sticky exemption added to it:

        keep_j   = L_i + 1 ≤ ⌈c · (Σ L + 1) / m⌉           (i = cand[j], m = len(cand))
        exempt_j = not keep_j and hit_i > Q_i and Q_i + N_i ≤ min over the kept of Q_k + N_k
    """
    m = len(cand)
    total = 0
    for j in range(m):
        total += load[cand[j]]
    cap = math.ceil(c * (total + 1) / m)
    keep = np.empty(m, dtype=np.bool_)
    kept = 0
    for j in range(m):
        keep[j] = load[cand[j]] < cap
        kept += keep[j]
    if kept == m or not sticky:
        return keep, False
    # the exemption's candidates: beyond the bound, holding more of r than they queue
    beyond = 0
    for j in range(m):
        i = cand[j]
        if not keep[j] and hit[i] > queued[i]:
            beyond += 1
    if beyond == 0:  # the common case
        return keep, False
    soonest = math.inf
    for j in range(m):
        if keep[j]:
            i = cand[j]
            own = queued[i] + new[i]
            if own < soonest:
                soonest = own
    out = keep.copy()
    added = False
    for j in range(m):
        i = cand[j]
        if not keep[j] and hit[i] > queued[i] and queued[i] + new[i] <= soonest:
            out[j] = True
            added = True
    return out, added


def _marginal_cost(
    new: np.ndarray, queued: np.ndarray, absorb: np.ndarray, load: np.ndarray, running: np.ndarray, cand: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """MarginalLatencyScorer's cost and tie-break per candidate:

        own_j    = Q_i + N_i
        stalled  = min(max(own_j − A_i, 0), N_i)
        cost_j   = (stalled · B_i + N_i · B̄) / 2 + own_j,   B̄ = Σ_cand B / m
        tie_j    = ⌊own_j⌋ + [Q_i = 0] · R_i / (max_cand R + 1),   R = running sequences

    (the fraction, below 1, orders only candidates whose whole own TTFT ties: among those with
    nothing queued, the one decoding fewer sequences)
    """
    m = len(cand)
    total = 0
    most = 0
    for j in range(m):
        total += load[cand[j]]
        if running[cand[j]] > most:
            most = running[cand[j]]
    mean = total / m
    cost = np.empty(m)
    tie = np.empty(m)
    for j in range(m):
        i = cand[j]
        n = new[i]
        o = queued[i] + n
        s = o - absorb[i]
        # np.maximum / np.minimum: a NaN stays NaN (the pipeline's score check refuses it)
        if s < 0.0:
            s = 0.0
        if s > n:
            s = float(n)
        x = s * load[i]
        x += n * mean
        x /= 2.0
        x += o
        cost[j] = x
        t = np.floor(o)
        if queued[i] == 0.0:
            t += running[i] / (most + 1.0)
        tie[j] = t
    return cost, tie


def _argmin_tied(scores: np.ndarray, tiebreak: np.ndarray, last_chosen: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """ArgminPicker's ties, as far as numbers break them: the candidates' rows with the lowest
    score; among those the lowest tiebreak (`tiebreak` empty: none given); among those the
    least recently chosen. One row in the usual case; the caller breaks what is left by worker
    id."""
    m = len(scores)
    low = scores[0]
    for j in range(1, m):
        if scores[j] < low:
            low = scores[j]
    tied = 0
    for j in range(m):
        if scores[j] == low:
            tied += 1
    idx = np.empty(tied, dtype=np.int64)
    k = 0
    for j in range(m):
        if scores[j] == low:
            idx[k] = j
            k += 1
    if tied > 1 and len(tiebreak) > 0:
        tb = tiebreak[idx[0]]
        for j in idx:
            if tiebreak[j] < tb:
                tb = tiebreak[j]
        idx = idx[tiebreak[idx] == tb]
    rows = cand[idx]
    if len(rows) > 1:
        lc = last_chosen[rows[0]]
        for i in rows:
            if last_chosen[i] < lc:
                lc = last_chosen[i]
        rows = rows[last_chosen[rows] == lc]
    return rows
