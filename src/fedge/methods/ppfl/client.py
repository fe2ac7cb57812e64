"""PPFL's client program (seed 001, Algorithm 1): the client's REE, which attests its enclave to the
server's, runs the released (frozen) layers on its data and feeds the resulting features batch by
batch to its enclave (``tee``), which trains the stage's layer and seals the upload. Details:
``docs/methods/ppfl.md``.
"""

from __future__ import annotations

import time

import torch

from fedge.core.context import ClientContext
from fedge.core.messages import Message
from fedge.methods.ppfl.enclaves import EnclaveSpec, _cv
from fedge.methods.ppfl.stages import frozen_net

__all__ = ["PpflClient"]


class PpflClient:
    """The client's REE: runs the frozen layers on its data and feeds the enclave batch by batch."""

    def __init__(self, spec: EnclaveSpec) -> None:
        self.spec = spec

    def run(self, message: Message, ctx: ClientContext) -> Message:
        c = message.config
        if c["op"] == "skip":
            return Message()
        tee = ctx.link("tee")
        if c["op"] == "attest":
            return tee.call(Message(config=dict(c)))
        model = self.spec.model_fn()
        frozen_arrays = {k: v for k, v in ctx.state.items() if isinstance(v, torch.Tensor)}
        frozen_arrays.update(message.arrays)
        ctx.state.update(message.arrays)
        stage = _cv(c, "stage", int)
        model.load_state_dict(frozen_arrays, strict=False)
        frozen = frozen_net(model, self.spec.stages, stage)
        t_start = time.perf_counter()
        tee.call(
            Message(config={"op": "begin", **{k: c[k] for k in ("blob", "rnd", "stage", "budget")}})
        )
        tee_s = open_s = time.perf_counter() - t_start
        for _ in range(_cv(c, "epochs", int)):
            for x, y in ctx.data.batches(_cv(c, "batch_size", int), generator=ctx.generator):
                with torch.no_grad():
                    f = frozen(x)
                t1 = time.perf_counter()
                tee.call(Message({"x": f, "y": y}, {"op": "batch"}))
                tee_s += time.perf_counter() - t1
        t1 = time.perf_counter()
        out = tee.call(Message(config={"op": "end"}))
        upload_s = time.perf_counter() - t1
        tee_s += upload_s
        ree_s = time.perf_counter() - t_start - tee_s  # frozen layers' forward and batching
        train_s = t1 - t_start - open_s
        return Message(
            config={"upload": out.config["upload"]},
            metrics={
                **out.metrics,
                "tee_s": tee_s,
                "ree_s": max(0.0, ree_s),
                "open_s": open_s,
                "train_s": train_s,
                "upload_s": upload_s,
            },
        )
