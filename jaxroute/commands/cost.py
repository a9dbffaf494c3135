"""`jaxroute cost`: step time and KV capacity of one GPU + model configuration."""

from __future__ import annotations

import json

from jaxroute import cost_models as cm
from jaxroute.commands._common import (
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
    p.add_argument("--gpu", default="A6000", metavar="NAME", help=f"GPU: {', '.join(cm.GPUS)} (default A6000)")
    p.add_argument("--model", default="Mistral-7B", metavar="NAME", help=f"model: {', '.join(cm.MODELS)} (default Mistral-7B)")
    p.add_argument("--tp", type=positive_int, default=1, metavar="T", help="tensor-parallel degree: GPUs that split the weights and KV (default 1)")
    p.add_argument("--cost-model", default="roofline", metavar="KIND",
                   help="roofline (calibrated on the lecture's A6000 anchors; any GPU/model) or preble "
                   "(Preble's fitted equations; Mistral-7B on one A6000 only) (default roofline)")
    p.add_argument("--prefill", type=positive_int, default=2048, metavar="N", help="prompt tokens of one prefill (default 2048)")
    p.add_argument("--cached", type=non_negative_int, default=0, metavar="C", help="tokens of that prompt already in the prefix cache (default 0)")
    p.add_argument("--decode-batch", type=positive_int, default=1, metavar="B", help="requests in one decode iteration (default 1)")
    p.add_argument("--context", type=positive_int, default=2048, metavar="C", help="context tokens of each decode request (default 2048)")
    p.add_argument("--mem-util", type=positive_fraction, default=0.9, metavar="F", help="fraction of GPU memory for weights + KV (default 0.9)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (keys include kv_capacity_tokens, prefill_s, decode_step_s) "
                   "(default: a text report)")
    p.add_argument("--list", action="store_true", help="list the GPU and model catalogs and exit (default: off)")
    p.set_defaults(func=run)


def _catalogs() -> str:
    lines = ["GPUs (dense bf16 TFLOP/s, memory TB/s, memory GB, link GB/s per direction):"]
    for g in cm.GPUS.values():
        lines.append(f"  {g.name:<10} {g.flops / 1e12:8.1f} {g.mem_bw / 1e12:6.2f} {g.mem_bytes / 1e9:6.0f} "
                     f"{g.link_bw / 1e9:6.0f}")
    lines.append("Models (total / active params in B, layers, KV bytes per token):")
    for m in cm.MODELS.values():
        lines.append(f"  {m.name:<14} {m.total_params / 1e9:7.2f} / {m.active_params / 1e9:6.2f} "
                     f"{m.n_layers:4d} {m.kv_bytes_per_token:9,d}")
    return "\n".join(lines)


def run(args) -> int:
    if args.list:
        print(_catalogs())
        return 0
    gpu, model = cm.get_gpu(args.gpu), cm.get_model(args.model)
    kind = args.cost_model.lower()
    if kind not in cm.KINDS:
        raise JaxrouteError(f"unknown cost model '{args.cost_model}'; choose from: {', '.join(cm.KINDS)}")
    tp, prefill, cached, batch, context = args.tp, args.prefill, args.cached, args.decode_batch, args.context
    mem_util = args.mem_util

    cp = cm.cost_params(gpu, model, tp=tp, kind=kind)
    capacity = cm.kv_capacity_tokens(gpu, model, tp=tp, mem_util=mem_util)
    prefill_s = float(cm.prefill_time(cp, prefill, cached))
    decode_s = float(cm.decode_step_time(cp, batch, context))
    if kind == "roofline":
        bound = {}
        for name, stats in (("prefill", cm.prefill_stats(prefill, cached)), ("decode", cm.decode_stats(batch, context))):
            compute_s, memory_s, _ = cm.roofline_terms(cp, stats)
            bound[name] = "compute-bound" if float(compute_s) >= float(memory_s) else "memory-bound"
    else:
        bound = {"prefill": "Preble fit", "decode": "Preble fit"}
    if cached + prefill > capacity or batch * context > capacity:
        warn(f"the requested tokens exceed the KV capacity ({capacity:,} tokens); times are extrapolated")

    if args.json:
        print(json.dumps({
            "gpu": gpu.name, "model": model.name, "tp": tp, "cost_model": kind, "mem_util": mem_util,
            "kv_capacity_tokens": capacity,
            "prefill_tokens": prefill, "prefill_cached": cached, "prefill_s": prefill_s,
            "decode_batch": batch, "decode_context": context, "decode_step_s": decode_s,
            "decode_tokens_per_s": batch / decode_s,
        }))
        return 0
    print(f"{model.name} on {tp}x {gpu.name}, cost model: {kind}")
    print(f"KV capacity ({mem_util:.0%} of memory): {capacity:,} tokens")
    print(f"prefill {prefill:,} tokens ({cached:,} cached): {prefill_s:.4f} s  [{bound['prefill']}]")
    print(f"decode step, {batch:,} x {context:,}-token context: {decode_s * 1e3:.2f} ms "
          f"({batch / decode_s:,.0f} tokens/s)  [{bound['decode']}]")
    return 0
