"""Reference for prefill/decode disaggregation (clusters/disagg.py), one run in plain Python.

The three stages, each by its own reference: the prefill tier is `reference_replicas.simulate` on the
disaggregated requests only (one output token each, outputs not cached), with P replicas; the KV
links are a loop in float32 (FIFO per prefill replica in order of readiness, ties by request order);
the decode tier is `reference_dp_decode.simulate` on D ranks, fed in order of landing (ties by request
order), the requests kept local being prefilled by their rank.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tests import reference_dp_decode, reference_replicas

F32 = np.float32


def simulate(table, *, n_prefill, prefill_router, cap, cost, chunk, B, Q, router_key, threshold, bytes_per_token,
             link_bytes_per_s, latency_s, decode_key, n_decode, decode_policy, decode_width=None, decode_kw=None,
             decode_tier="dp"):
    """Per-request records in arrival order: prefill replica/admit/done, link start, delivered, decode
    worker, first token, finish. decode_tier "dp": `reference_dp_decode` (decode_policy an id, decode_width the
    jitted tier's rank count: its random draws span it); "replicas": `reference_replicas` on the requests in
    landing order, the transferred ones with their KV landed (decode_policy a preset name, decode_kw its B, Q)."""
    prompt = np.asarray(table.prompt_tok)
    out = np.asarray(table.out_tok)
    arrival = np.asarray(table.arrival_s, F32)
    n = len(prompt)
    disagg = prompt.astype(F32) >= F32(threshold)
    idx = np.flatnonzero(disagg)
    dummy = len(np.asarray(table.seg_len)) - 1
    sub = dataclasses.replace(
        table, arrival_s=arrival[idx], seg_ids=np.asarray(table.seg_ids)[idx], seg_tok=np.asarray(table.seg_tok)[idx],
        out_tok=np.ones(len(idx), np.int32), out_seg=np.full(len(idx), dummy, np.int32), prompt_tok=prompt[idx],
        session=np.asarray(table.session)[idx])
    rec = dict(prefill_replica=np.full(n, -1), prefill_admit=np.full(n, np.inf, F32), prefill_done=np.full(n, np.inf, F32),
               link_start=np.full(n, np.inf, F32), delivered=np.full(n, np.inf, F32))
    if len(idx):
        pre, violations = reference_replicas.simulate(sub, G=n_prefill, cap=cap, policy=prefill_router, cost=cost,
                                                      chunk=chunk, B=B, Q=Q, router_key=router_key)
        assert violations == []
        rec["prefill_replica"][idx] = pre["replica"]
        rec["prefill_admit"][idx] = pre["admit"]
        rec["prefill_done"][idx] = pre["finish"]
    # KV links: one per prefill replica, FIFO by readiness
    free = [F32(0.0)] * n_prefill
    for i in sorted(idx, key=lambda i: (rec["prefill_done"][i], i)):
        g = rec["prefill_replica"][i]
        start = max(rec["prefill_done"][i], free[g])
        busy = F32(F32(bytes_per_token) * F32(prompt[i])) / F32(link_bytes_per_s)
        free[g] = F32(start + busy)
        rec["link_start"][i] = start
        rec["delivered"][i] = F32(free[g] + F32(latency_s))
    land = np.where(disagg, rec["delivered"], arrival).astype(F32)
    order = sorted(range(n), key=lambda i: (land[i], i))
    back = lambda x: np.asarray(x)[np.argsort(order)]
    if decode_tier == "replicas":
        o = np.asarray(order)
        landed = dataclasses.replace(
            table, arrival_s=land[o], seg_ids=np.asarray(table.seg_ids)[o], seg_tok=np.asarray(table.seg_tok)[o],
            out_tok=out[o], out_seg=np.asarray(table.out_seg)[o], prompt_tok=prompt[o], session=np.asarray(table.session)[o],
            landed=disagg[o])
        dec, violations = reference_replicas.simulate(landed, G=n_decode, cap=cap, policy=decode_policy, cost=cost,
                                                      chunk=chunk, router_key=decode_key, **decode_kw)
        assert violations == []
        rec.update(disagg=disagg, decode_worker=back(dec["replica"]), first_token=back(dec["first"]),
                   finish=back(dec["finish"]), done=np.isfinite(back(dec["finish"])), decode_cached=back(dec["cached"]))
        return rec
    dec = reference_dp_decode.simulate(decode_key, [int(prompt[i]) for i in order], [int(out[i]) for i in order],
                                       [float(land[i]) for i in order], n_workers=n_decode, cost=cost,
                                       policy=decode_policy, arrival=2, local=[not disagg[i] for i in order],
                                       draw_width=decode_width, **decode_kw)
    rec.update(disagg=disagg, decode_worker=back(dec["worker"]), first_token=back(dec["first_t"]),
               finish=back(dec["finish_t"]), done=back(dec["done"]), imbalance_tokens=dec["imbalance_tokens"])
    return rec
