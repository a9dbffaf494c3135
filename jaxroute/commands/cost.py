"""`jaxroute cost`: step time and KV capacity of one GPU + model configuration."""

from __future__ import annotations

import json

from jaxroute import catalog
from jaxroute.clusters.names import REPLICA_GPU, REPLICA_MODEL
from jaxroute.commands._common import (
    add_latency_args,
    add_model_args,
    latency_choice,
    non_negative_int,
    positive_fraction,
    positive_int,
    warn,
)
from jaxroute.errors import JaxrouteError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "cost",
        help="iteration time and KV capacity of a model on a GPU (roofline or Preble's fit)",
        description="Print the prefill time, the decode step time and the KV-cache capacity of a model "
        "on a GPU, from jaxroute's cost models. Names are case-insensitive.",
    )
    p.add_argument("--gpu", default=REPLICA_GPU, metavar="NAME", help=f"GPU: {', '.join(catalog.GPUS)} (default {REPLICA_GPU})")
    add_model_args(p, default=REPLICA_MODEL, help=f"model: {', '.join(catalog.MODELS)} (default {REPLICA_MODEL})")
    p.add_argument("--tp", type=positive_int, default=1, metavar="T", help="tensor-parallel degree: GPUs that split the weights and KV (default 1)")
    add_latency_args(p, default="roofline")
    p.add_argument("--prefill", type=positive_int, default=2048, metavar="N", help="prompt tokens of one prefill (default 2048)")
    p.add_argument("--cached", type=non_negative_int, default=0, metavar="C", help="tokens of that prompt already in the prefix cache (default 0)")
    p.add_argument("--decode-batch", type=positive_int, default=1, metavar="B", help="requests in one decode iteration (default 1)")
    p.add_argument("--context", type=positive_int, default=2048, metavar="C", help="context tokens of each decode request (default 2048)")
    p.add_argument("--mem-util", type=positive_fraction, default=0.9, metavar="F", help="fraction of GPU memory for weights + KV (default 0.9)")
    p.add_argument("--parallel", default="independent", metavar="MODE",
                   help="decode data parallelism over --dp-ranks ranks of --tp devices: independent (each rank a "
                   "replica) or dp_ep (DP attention + expert-parallel MoE over all ranks' devices; MoE models) "
                   "(default independent)")
    p.add_argument("--dp-ranks", type=positive_int, default=1, metavar="G",
                   help="decode DP ranks, each running --decode-batch requests of --context tokens (default 1)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (keys include kv_capacity_tokens, prefill_s, decode_step_s) "
                   "(default: a text report)")
    p.add_argument("--list", action="store_true", help="list the GPU and model catalogs and exit (default: off)")
    p.set_defaults(func=run)


def _catalogs() -> str:
    lines = ["GPUs (one device: dense bf16 TFLOP/s, dense INT8 TOP/s, dense FP8 TFLOP/s (0: none), memory TB/s, "
             "memory GB, link GB/s per direction; Ascend-910C is one of the package's two dies):"]
    for g in catalog.GPUS.values():
        lines.append(f"  {g.name:<11} {g.flops / 1e12:8.1f} {g.int8_ops / 1e12:8.1f} {g.fp8_flops / 1e12:8.1f} "
                     f"{g.mem_bw / 1e12:6.2f} {g.mem_bytes / 1e9:6.0f} {g.link_bw / 1e9:6.0f}")
    lines.append("Models (total / active params in B, layers, KV bytes per token):")
    for m in catalog.MODELS.values():
        lines.append(f"  {m.name:<16} {m.total_params / 1e9:7.2f} / {m.active_params / 1e9:6.2f} "
                     f"{m.n_layers:4d} {m.kv_bytes_per_token:9,d}")
    return "\n".join(lines)


def run(args) -> int:
    if args.list:
        print(_catalogs())
        return 0
    gpu, model = catalog.get_gpu(args.gpu), catalog.get_model(args.model)
    kind, latency = latency_choice(args)
    # the cost model, once the names and files are checked
    import jax.numpy as jnp

    from jaxroute import cost_models as cm

    tp, prefill, cached, batch, context = args.tp, args.prefill, args.cached, args.decode_batch, args.context
    mem_util, parallel, ranks = args.mem_util, args.parallel.lower(), args.dp_ranks
    if parallel == "dp_ep" and cached:
        raise JaxrouteError("--cached is not modelled with --parallel dp_ep (its prefill is one chunk on nothing cached)")

    cp = cm.cost_params(gpu, model, tp=tp, kind=kind, parallel=parallel, dp_ranks=ranks)
    if latency is not None:
        cp = cm.with_latency_params(cp, latency)
    capacity = cm.kv_capacity_tokens(gpu, model, tp=tp, mem_util=mem_util, parallel=parallel, dp_ranks=ranks)
    batches = jnp.full(ranks, float(batch))
    kv = jnp.full(ranks, float(batch * context))
    kv_fraction = float(cm.kv_step_fraction(cp, batches, kv))
    terms = None
    if parallel == "dp_ep":
        # prefill: one rank prefills the prompt, the others idle (their experts still serve it)
        one = jnp.zeros(ranks).at[0].set(float(prefill))
        prefill_s = float(cm.dp_step_times(cp, jnp.zeros(ranks), jnp.zeros(ranks), one)[0])
        decode_s = float(cm.dp_step_times(cp, batches, kv)[0])
        t = cm.dp_ep_terms(cp, batches, kv)
        terms = {"attention_s": float(t.attention_s[0]), "kv_read_s": float(t.kv_read_s[0]),
                 "experts_s": float(t.experts_s), "all_to_all_s": float(t.all_to_all_s),
                 "overhead_s": float(t.overhead_s)}
        bound = {"prefill": "dp_ep", "decode": "dp_ep"}
    else:
        prefill_s = float(cm.prefill_time(cp, prefill, cached))
        decode_s = float(cm.decode_step_time(cp, batch, context))
        if kind == "roofline":
            bound = {}
            for name, stats in (("prefill", cm.prefill_stats(prefill, cached)), ("decode", cm.decode_stats(batch, context))):
                compute_s, memory_s, _ = cm.roofline_terms(cp, stats)
                bound[name] = "compute-bound" if float(compute_s) >= float(memory_s) else "memory-bound"
        else:
            bound = {"prefill": f"{kind} model", "decode": f"{kind} model"}
    if cached + prefill > capacity or batch * context > capacity:
        warn(f"the requested tokens exceed the KV capacity ({capacity:,} tokens); times are extrapolated")
    tokens_per_s = ranks * batch / decode_s  # all ranks step together (independent: identical replicas)
    both = {}  # the trained model and the roofline side by side (independent ranks)
    if parallel != "dp_ep" and kind != "preble":
        for other in ("trained", "roofline"):
            c = cp if other == kind else cm.cost_params(gpu, model, tp=tp, kind=other)
            both[other] = {"prefill_s": float(cm.prefill_time(c, prefill, cached)),
                           "decode_step_s": float(cm.decode_step_time(c, batch, context)),
                           "first_token_extra_s": float(c.alpha[0] + c.alpha[1] * prefill),
                           "per_output_token_extra_s": float(c.alpha[2])}

    if args.json:
        out = {
            "gpu": gpu.name, "model": model.name, "tp": tp, "cost_model": kind, "mem_util": mem_util,
            "parallel": parallel, "dp_ranks": ranks,
            "kv_capacity_tokens": capacity,
            "prefill_tokens": prefill, "prefill_cached": cached, "prefill_s": prefill_s,
            "decode_batch": batch, "decode_context": context, "decode_step_s": decode_s,
            "decode_tokens_per_s": tokens_per_s, "kv_step_fraction": kv_fraction,
        }
        if terms is not None:
            out["decode_terms"] = terms
        if both:
            out["latency_models"] = both
        print(json.dumps(out))
        return 0
    if parallel == "dp_ep":
        print(f"{model.name} on {ranks} DP ranks x {tp}x {gpu.name}, DP attention + expert-parallel MoE over "
              f"{ranks * tp} devices, cost model: {kind}")
        print(f"KV capacity per DP rank ({mem_util:.0%} of memory): {capacity:,} tokens")
        print(f"prefill {prefill:,} tokens on one rank: {prefill_s:.4f} s")
        print(f"decode step, {ranks} ranks x {batch:,} x {context:,}-token context: {decode_s * 1e3:.2f} ms "
              f"({tokens_per_s:,.0f} tokens/s); {kv_fraction:.1%} of it scales with the max KV load")
        print(f"  attention per rank {terms['attention_s'] * 1e3:.2f} ms (KV reads {terms['kv_read_s'] * 1e3:.2f} ms), "
              f"experts {terms['experts_s'] * 1e3:.2f} ms, all-to-all {terms['all_to_all_s'] * 1e3:.2f} ms, "
              f"overhead {terms['overhead_s'] * 1e3:.2f} ms")
        return 0
    print(f"{model.name} on {tp}x {gpu.name}, cost model: {kind}")
    print(f"KV capacity ({mem_util:.0%} of memory): {capacity:,} tokens")
    print(f"prefill {prefill:,} tokens ({cached:,} cached): {prefill_s:.4f} s  [{bound['prefill']}]")
    ranks_text = f"{ranks} independent ranks x " if ranks > 1 else ""
    print(f"decode step, {ranks_text}{batch:,} x {context:,}-token context: {decode_s * 1e3:.2f} ms "
          f"({tokens_per_s:,.0f} tokens/s)  [{bound['decode']}]; {kv_fraction:.1%} of it scales with KV")
    for name, v in both.items():
        print(f"  {name:8s}: prefill {v['prefill_s']:.4f} s, decode step {v['decode_step_s'] * 1e3:.2f} ms; request-level "
              f"costs {v['first_token_extra_s'] * 1e3:.1f} ms before the first token, "
              f"{v['per_output_token_extra_s'] * 1e6:.0f} us per output token")
    return 0
