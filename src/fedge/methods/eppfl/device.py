"""EPPFL's device (seed 003, Algorithm 1 lines 5-26): unmask the global M_c, train it with its edge
server over E local epochs — forward to the cut, activation selection (θ_a), Laplace noise (per-sample
L1 clip, or the paper's data-dependent scale: :mod:`.noise`), the edge server's gradients for the
released values only (dA'_b, Sec. 2.2), backward, SGD with momentum — and upload it masked. Details, and how its randomness keeps the batches of
unsplit training: ``docs/methods/eppfl.md``, "The device's step".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedge.core.context import ClientContext
from fedge.core.errors import MessageError
from fedge.core.messages import ConfigValue, Message
from fedge.methods.eppfl.noise import ActivationNoise, activation_noise
from fedge.methods.eppfl.parties import seeded_rng
from fedge.methods.eppfl.split import Split, activation_positions, kept, scatter
from fedge.privacy.dp.mechanisms import SECURE
from fedge.privacy.secagg import FixedPoint
from fedge.privacy.secagg.prg import prg

__all__ = ["DeviceProgram", "float_keys", "flatten", "unflatten"]


def float_keys(split: Split) -> list[str]:
    """M_c's floating-point state entries (model keys, sorted): what is masked."""
    state = split.device.state_dict()
    return sorted(k for k, local in split.device_keys.items() if state[local].is_floating_point())


def flatten(arrays: dict[str, torch.Tensor], keys: list[str]) -> np.ndarray:
    return np.concatenate([arrays[k].detach().to(torch.float64).reshape(-1).numpy() for k in keys])


def unflatten(
    flat: np.ndarray, template: dict[str, torch.Tensor], keys: list[str]
) -> dict[str, torch.Tensor]:
    out, i = {}, 0
    for k in keys:
        t = template[k]
        out[k] = torch.from_numpy(flat[i : i + t.numel()].copy()).to(t.dtype).reshape(t.shape)
        i += t.numel()
    return out


class DeviceProgram:
    """Client program of EPPFL.

    Args:
        split_fn: builds the split model (once per process; M_c's module is a work buffer).
        cfg: the method config (``EppflConfig``).
        fp: the fixed-point ring of the masks.
    """

    def __init__(self, split_fn: Callable[[], Split], cfg: Any, fp: FixedPoint) -> None:
        self.split_fn, self.cfg, self.fp = split_fn, cfg, fp
        self._split: Split | None = None
        self.mech: ActivationNoise | None = (
            None
            if cfg.dp is None
            else activation_noise(cfg.dp.epsilon, cfg.dp.sensitivity, cfg.dp.clip)
        )
        self.secure_noise = (
            cfg.dp is not None and cfg.dp.secure_noise
        )  # the OS CSPRNG, not the run's generators

    @property
    def split(self) -> Split:
        if self._split is None:
            self._split = self.split_fn()
            self._split.device.train()
        return self._split

    def template(self) -> dict[str, torch.Tensor]:
        state = self.split.device.state_dict()
        return {k: state[local] for k, local in self.split.device_keys.items()}

    def _global_model(
        self, message: Message, ctx: ClientContext, sr: Message | None
    ) -> dict[str, torch.Tensor]:
        """Step ⑨: W_c = (masked sum − Σ r_j) / |C_t|, or the plain model when unmasked."""
        who = f"round {ctx.rnd}, device {ctx.cid}"
        arrays = dict(message.arrays)
        blob = message.config.get("masked_sum")
        if blob is None:
            return arrays
        mask_sum = None if sr is None else sr.config.get("mask_sum")
        if not isinstance(mask_sum, bytes) or not isinstance(blob, bytes):
            raise MessageError(f"{who}: a masked model without S_r's mask sum")
        count = message.config_int("count")
        total = self.fp.sub(self.fp.from_bytes(blob), self.fp.from_bytes(mask_sum))
        keys = float_keys(self.split)
        arrays.update(unflatten(self.fp.decode(total) / count, self.template(), keys))
        return arrays

    def run(self, message: Message, ctx: ClientContext) -> Message:
        cfg, sp = self.cfg, self.split
        who = f"round {ctx.rnd}, device {ctx.cid}"
        sr = None
        if cfg.masks:  # step ① / line 6: this round's mask seed and, if needed, Σ r_j
            sr_req: dict[str, ConfigValue] = {
                "op": "device",
                "cid": ctx.cid,
                "round": ctx.rnd,
                "unmask_round": message.config_int("model_round", 0),
            }
            sr = ctx.link("sr").call(Message(config=sr_req))
        arrays = self._global_model(message, ctx, sr)
        state = sp.device.state_dict()
        with torch.no_grad():
            for key, local in sp.device_keys.items():
                if key not in arrays:
                    raise MessageError(f"{who}: the global model lacks {key!r}")
                state[local].copy_(arrays[key])
        ctx.meter.resident = sp.device
        params = list(sp.device.parameters())
        opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
        noise_gen = torch.Generator().manual_seed(seeded_rng(ctx.generator))
        edge = ctx.link("edge")
        losses: list[float] = []
        for _ in range(cfg.local_epochs):
            for x, y in ctx.data.batches(cfg.batch_size, generator=ctx.generator):
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seeded_rng(noise_gen))  # dropout in M_c, if any
                    a = sp.device(x)
                shape = tuple(a.shape)
                b, c = shape[0], shape[1] if a.dim() > 2 else 1
                n = a[0].numel() // c
                flat = a.reshape(b, c, n)
                seed, pos = -1, None
                if cfg.theta_a < 1:
                    seed = seeded_rng(noise_gen)
                    pos = activation_positions(seed, (b, c, n), kept(n, cfg.theta_a))
                    flat = flat.gather(-1, pos)
                if self.mech is not None:
                    vals, released = self.mech.release(
                        flat, generator=SECURE if self.secure_noise else noise_gen
                    )
                else:
                    vals, released = flat, flat.detach()
                req = Message(
                    {"a": released.contiguous(), "y": y.to(torch.int32)},
                    config={"op": "step", "seed": seed, "shape": ",".join(map(str, shape))},
                )
                reply = edge.call(req)
                g = reply.arrays["g"]  # dA'_b at the released values, or θ_g's top-k of them
                if "pos" in reply.arrays:
                    g = scatter(g, reply.arrays["pos"], vals.shape[-1])
                if g.shape != vals.shape:
                    raise MessageError(
                        f"{who}: the edge server returned gradients of shape {tuple(g.shape)}; "
                        f"expected one per released activation, {tuple(vals.shape)}"
                    )
                opt.zero_grad(set_to_none=True)
                vals.backward(g.to(vals.dtype))
                opt.step()
                losses.append(float(reply.metrics["loss"]))
        metrics = {"train_loss": sum(losses) / len(losses)} if losses else {}
        config: dict[
            str, Any
        ] = {}  # no num_samples: S_a weighs uploads equally (Eq. 9) and must not learn |d_i|
        state = sp.device.state_dict()
        out = {k: state[local].detach().clone() for k, local in sp.device_keys.items()}
        if not cfg.masks:
            return Message(out, config=config, metrics=metrics)
        # step ④, Eq. (8): W_c + r_i in Z_{2^64}; integer buffers (counters) travel plain
        assert sr is not None
        keys = float_keys(sp)
        q = self.fp.encode(flatten(out, keys), n_summands=message.config_int("n_summands"))
        mask_seed = sr.config.get("mask_seed")
        if not isinstance(mask_seed, bytes):
            raise MessageError(f"{who}: S_r sent no mask seed (got {mask_seed!r})")
        r = prg(mask_seed, q.size, bits=self.fp.bits)
        config["masked"] = self.fp.to_bytes(self.fp.add(q, r))
        plain = {k: v for k, v in out.items() if k not in keys}
        return Message(plain, config=config, metrics=metrics)
