"""EPPFL's side parties (seed 003, Fig. 1): the edge server S_e, one per device (``scope="client"``,
steps ③ ⑤ ⑦, Eq. (3)-(4)), which holds M_s and answers a device's released activations with the
selected gradients; and the random-number server S_r (``scope="shared"``, steps ① ④ ⑧), which gives
each device its mask seed r_i^t = PRG(HKDF(secret, t, i)) over Z_{2^64} and the sum of the masks of
the devices S_a aggregated. Their messages, what S_r does and does not bound, and why the secret
comes from the run seed (a simulation, not a deployment): ``docs/methods/eppfl.md``, "The side
parties".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedge.core.context import PartyContext
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.methods.eppfl.split import (
    Split,
    activation_positions,
    gradient_positions,
    kept,
    position_dtype,
    scatter,
)
from fedge.privacy.secagg import FixedPoint
from fedge.privacy.secagg.prg import prg

__all__ = ["EdgeServer", "MaskKeys", "RandomnessServer", "seeded_rng"]


class MaskKeys:
    """S_r's secret and the masks derived from it (also used, in the simulation only, by
    the evaluation harness to read the global M_c; see ``docs/methods/eppfl.md``,
    "Simulation shortcut")."""

    def __init__(self, secret: bytes, length: int, fp: FixedPoint) -> None:
        self.secret, self.length, self.fp = secret, length, fp

    @staticmethod
    def from_run_seed(seed: int, length: int, fp: FixedPoint) -> MaskKeys:
        """A secret derived from the run seed: reproducible, and the same in every process that
        hosts S_r, but known to anyone who knows the seed (``docs/methods/eppfl.md``, "The side
        parties")."""
        hk = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"fedge-eppfl-sr-secret")
        return MaskKeys(hk.derive(int(seed).to_bytes(16, "little", signed=True)), length, fp)

    def seed(self, rnd: int, cid: int) -> bytes:
        info = b"eppfl-mask|" + int(rnd).to_bytes(8, "little") + int(cid).to_bytes(8, "little")
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(self.secret)

    def mask(self, rnd: int, cid: int) -> np.ndarray:
        return prg(self.seed(rnd, cid), self.length, bits=self.fp.bits)

    def mask_sum(self, rnd: int, ids: list[int]) -> np.ndarray:
        return self.fp.ring_sum(self.mask(rnd, c) for c in ids)


class RandomnessServer:
    """S_r (``docs/methods/eppfl.md``, "The side parties")."""

    def __init__(self, keys: MaskKeys) -> None:
        self.keys = keys

    def handle(self, message: Message, ctx: PartyContext) -> Message:
        op = message.config.get("op")
        if op == "aggregate":
            rnd = message.config_int("round")
            ctx.state.clear()
            ctx.state.update(agg_round=rnd, agg_ids=message.arrays["ids"].to(torch.int64))
            return Message(config={"ok": True})
        if op != "device":
            raise MessageError(f"S_r: unknown request {op!r}; expected 'device' or 'aggregate'")
        cid, rnd = message.config_int("cid"), message.config_int("round")
        out: dict[str, Any] = {"mask_seed": self.keys.seed(rnd, cid)}
        unmask = message.config_int("unmask_round", 0)
        if unmask > 0:
            if ctx.state.get("agg_round") != unmask:
                raise MessageError(
                    f"S_r: device {cid} asks for the masks of round {unmask}, "
                    f"but the last aggregate registered is round {ctx.state.get('agg_round')}"
                )
            ids = [int(v) for v in ctx.state["agg_ids"].tolist()]
            out["mask_sum"] = self.keys.fp.to_bytes(self.keys.mask_sum(unmask, ids))
        return Message(config=out)


def seeded_rng(gen: torch.Generator) -> int:
    """A 62-bit seed drawn from ``gen`` (for forked global RNG around dropout layers and for
    activation-selection seeds)."""
    return int(torch.randint(0, 2**62, (1,), generator=gen))


class EdgeServer:
    """S_e (``docs/methods/eppfl.md``, "The side parties"). ``split_fn`` builds the split model
    once per process (the module is a work buffer: the weights live in ``ctx.state``)."""

    def __init__(
        self, split_fn: Callable[[], Split], *, theta_g: float, lr: float, momentum: float
    ) -> None:
        self.split_fn, self.theta_g, self.lr, self.momentum = split_fn, theta_g, lr, momentum
        self._split: Split | None = None

    @property
    def split(self) -> Split:
        if self._split is None:
            self._split = self.split_fn()
            self._split.edge.train()
        return self._split

    def __call__(self) -> EdgeServer:  # PartySpec.factory: one instance (and module) per process
        return self

    def handle(self, message: Message, ctx: PartyContext) -> Message:
        op = message.config.get("op")
        if op == "load":
            ctx.state.clear()
            params = {k for k, _ in self.split.edge.named_parameters()}
            for key, local in self.split.edge_keys.items():
                t = message.arrays[key].clone()
                ctx.state[("w/" if local in params else "b/") + key] = t
            return Message()
        if op == "step":
            return self._step(message, ctx)
        if op in ("upload", "discard"):
            arrays = (
                {k[2:]: v for k, v in ctx.state.items() if k[:2] in ("w/", "b/")}
                if op == "upload"
                else {}
            )
            ctx.state.clear()
            return Message(arrays)
        raise MessageError(f"edge server {ctx.key}: unknown request {op!r}")

    def _step(self, message: Message, ctx: PartyContext) -> Message:
        sp = self.split
        if not any(k.startswith("w/") for k in ctx.state):
            raise MessageError(f"edge server {ctx.key}: a training step before S_a sent M_s")
        shape = tuple(int(s) for s in str(message.config["shape"]).split(","))
        b, c = shape[0], shape[1] if len(shape) > 2 else 1
        n = int(np.prod(shape[1:])) // c
        values = message.arrays["a"].to(torch.float32)
        seed = message.config_int("seed", -1)
        pos = None
        if seed >= 0:
            pos = activation_positions(seed, (b, c, n), values.shape[-1])
            dense = scatter(values, pos, n)  # zeros where nothing was released: M_s's input
        else:
            dense = values.reshape(b, c, n)
        a_hat = dense.reshape(shape).requires_grad_(True)
        names = [k[2:] for k in ctx.state if k.startswith("w/")]
        params = [ctx.state["w/" + k].requires_grad_(True) for k in names]
        tensors = {sp.edge_keys[k]: ctx.state["w/" + k] for k in names}
        tensors.update({sp.edge_keys[k[2:]]: v for k, v in ctx.state.items() if k.startswith("b/")})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seeded_rng(ctx.generator))  # dropout on M_s: derived, not global
            out = torch.func.functional_call(sp.edge, tensors, (a_hat,))
        loss = F.cross_entropy(out, message.arrays["y"].long())
        grads = torch.autograd.grad(loss, [a_hat, *params])
        with torch.no_grad():
            for k, p, g in zip(names, params, grads[1:], strict=True):
                p.requires_grad_(False)
                if self.momentum:
                    buf = ctx.state.get("m/" + k)
                    buf = g.clone() if buf is None else buf.mul_(self.momentum).add_(g)
                    ctx.state["m/" + k] = buf
                    g = buf
                p.add_(g, alpha=-self.lr)
        da = grads[0].reshape(b, c, n)
        if pos is not None:  # dA'_b: the loss's partial w.r.t. the released values, (B, C, k_a)
            da = da.gather(-1, pos)
        metrics = {"loss": float(loss.detach())}
        k_a = da.shape[-1]
        k_g = kept(k_a, self.theta_g)  # θ_g of the gradients the device can use
        if k_g < k_a:
            idx = gradient_positions(da, k_g)  # indices among the released values
            return Message(
                {"g": da.gather(-1, idx), "pos": idx.to(position_dtype(k_a))}, metrics=metrics
            )
        return Message({"g": da}, metrics=metrics)
