"""Which attention kernel HF BERT's training step gets under kiln on the GPU, and why.

    python benchmarks/gpu/attention_diag.py            # on the H200 (device tool)

Records every ``scaled_dot_product_attention`` call kiln traces for BERT-base (8 x 512, with
and without an ``attention_mask``), then asks the dispatcher which kernel real tensors of the
same metadata would get and, for the memory-efficient kernel, why not (its debug warnings).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import training

CALLS: list[dict] = []


def meta(t):
    if not isinstance(t, torch.Tensor):
        return t
    return dict(shape=tuple(t.shape), stride=tuple(t.stride()), dtype=t.dtype, rg=t.requires_grad)


class Record(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            CALLS.append(
                dict(args=[meta(a) for a in args], kwargs={k: meta(v) for k, v in kwargs.items()})
            )
        return func(*args, **kwargs)


def real(m):
    if not isinstance(m, dict):
        return m
    size = 1 + sum((s - 1) * st for s, st in zip(m["shape"], m["stride"]))
    base = (
        torch.randn(size, device="cuda").to(m["dtype"])
        if m["dtype"] != torch.bool
        else torch.ones(size, device="cuda", dtype=torch.bool)
    )
    return base.as_strided(m["shape"], m["stride"]).requires_grad_(
        m["rg"] and m["dtype"].is_floating_point
    )


def main():
    import transformers

    import kiln

    print("transformers", transformers.__version__, "torch", torch.__version__)
    for with_mask in (False, True):
        kiln.reset()
        CALLS.clear()
        model, inputs = training.build("bert", True)
        training._no_dropout(model)
        model = model.cuda().train()
        inputs = {k: v.cuda() for k, v in inputs.items()}
        if with_mask:
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        with Record():
            out = kiln.compile(model)(**inputs)
        out[0].float().mean().backward()
        print(
            f"\n== attention_mask passed: {with_mask}; {len(CALLS)} sdpa calls traced; stats {kiln.stats()}"
        )
        if not CALLS:
            continue
        c = CALLS[0]
        print("first call:", c)
        q, k, v, *rest = [real(a) for a in c["args"]]
        kw = {n: real(x) for n, x in c["kwargs"].items()}
        mask = rest[0] if rest else kw.get("attn_mask")
        dropout = kw.get("dropout_p", rest[1] if len(rest) > 1 else 0.0)
        causal = kw.get("is_causal", False)
        choice = torch._fused_sdp_choice(q, k, v, mask, dropout, causal, scale=kw.get("scale"))
        print(
            "dispatcher choice:", choice, "(0 math, 1 flash, 2 efficient, 3 cudnn, per SDPBackend)"
        )
        params = torch.backends.cuda.SDPAParams(q, k, v, mask, dropout, causal, False)
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            ok = torch.backends.cuda.can_use_efficient_attention(params, True)
        print("can_use_efficient_attention:", ok, [str(w.message)[:300] for w in ws])
        if mask is not None:
            float_mask = (
                torch.zeros(mask.shape, device="cuda").masked_fill(~mask, float("-inf"))
                if mask.dtype == torch.bool
                else mask
            )
            for name, m in [
                ("float mask same shape", float_mask),
                ("float mask contiguous", float_mask.contiguous()),
                (
                    "float mask expanded to heads",
                    float_mask.expand(q.shape[0], q.shape[1], *float_mask.shape[2:]),
                ),
            ]:
                try:
                    print(
                        name,
                        m.shape,
                        m.stride(),
                        "->",
                        torch._fused_sdp_choice(q, k, v, m, dropout, causal, scale=kw.get("scale")),
                    )
                except Exception as e:
                    print(name, "error", e)


if __name__ == "__main__":
    main()
