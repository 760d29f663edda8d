"""Compressed outer rounds with and without error feedback, against the exact outer round.

The measurement behind the choice in :mod:`decent_dp._engine.outer` (no error-feedback
buffer). One process plays ``n`` workers of DiLoCo: AdamW inner steps on
non-identical data (each worker's inputs shifted, labels from one teacher
network), every ``H`` steps Nesterov SGD (lr 0.7, momentum 0.9) on the outer
gradient, which is either the exact mean of ``Delta_i = x_outer - x_i`` or the
mean decoded from the two-phase exchange of :mod:`decent_dp._comm.compressed`
(each worker's chunks compressed, each chunk's sum compressed again), with the
library's own encoders. Error feedback keeps both roundings (a worker's of its
``Delta_i``, a chunk owner's of its sum) and adds them to the next round's
values. A run whose start is scaled by ``1 + 1e-6`` gives the noise floor: how
far a trajectory moves for a perturbation far below any compressor's.

Columns: the final loss on held-out data of each worker's distribution, its
difference from the exact run's, and ``||x_outer - x_outer_exact||`` over
``||x_outer_exact - x(0)||``.

Example::

    python -m experiments.bench.outer_error_feedback --model linear
    python -m experiments.bench.outer_error_feedback --model mlp
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from decent_dp.compression import bf16_decode, bf16_encode, chunk_len, int8_decode, int8_encode
from experiments.report.doc_data import md_table

CODECS = {"int8": (int8_encode, int8_decode), "bf16": (bf16_encode, bf16_decode)}
D_IN, CLASSES = 64, 10


def _teacher() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, 64), nn.Tanh(), nn.Linear(64, CLASSES))


def _student(kind: str) -> nn.Module:
    torch.manual_seed(1)
    if kind == "linear":
        return nn.Linear(D_IN, CLASSES)
    return nn.Sequential(
        nn.Linear(D_IN, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES)
    )


def _batch(teacher: nn.Module, worker: int, n_workers: int, step: int, size: int = 64):
    g = torch.Generator().manual_seed(1000 * worker + step)
    x = torch.randn(size, D_IN, generator=g) + 0.5 * (worker - (n_workers - 1) / 2)
    with torch.no_grad():
        y = teacher(x).argmax(1)
    return x, y


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _load(model: nn.Module, values: torch.Tensor) -> None:
    params = list(model.parameters())
    with torch.no_grad():
        for p, v in zip(params, values.split([p.numel() for p in params])):
            p.copy_(v.view_as(p))


class _Exchange:
    """The two-phase exchange's decoded mean, with optional error feedback on both roundings."""

    def __init__(self, codec: str, numel: int, k: int, feedback: bool):
        self.encode, self.decode = CODECS[codec]
        self.numel, self.k, self.m = numel, k, chunk_len(numel, k)
        self.own = [torch.zeros(k * self.m) for _ in range(k)] if feedback else None
        self.sums = [torch.zeros(self.m) for _ in range(k)] if feedback else None

    def _round(self, v: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(v), v.numel(), v.dtype)

    def mean(self, deltas: list[torch.Tensor]) -> torch.Tensor:
        k, m = self.k, self.m
        sent = []
        for i, d in enumerate(deltas):
            v = torch.zeros(k * m)
            v[: self.numel] = d
            if self.own is not None:
                v += self.own[i]
            q = torch.cat([self._round(v[c * m : (c + 1) * m]) for c in range(k)])
            if self.own is not None:
                self.own[i] = v - q
            sent.append(q)
        out = []
        for c in range(k):
            s = sum(q[c * m : (c + 1) * m] for q in sent)
            assert isinstance(s, torch.Tensor)
            if self.sums is not None:
                s = s + self.sums[c]
            shat = self._round(s)
            if self.sums is not None:
                self.sums[c] = s - shat
            out.append(shat)
        return torch.cat(out)[: self.numel] / k


def run(
    kind: str,
    codec: str | None,
    feedback: bool = False,
    workers: int = 4,
    every: int = 8,
    steps: int = 480,
    jolt: float = 0.0,
) -> tuple[torch.Tensor, float]:
    """One DiLoCo run; returns the final ``x_outer`` and its held-out loss."""
    teacher = _teacher()
    models = [_student(kind) for _ in range(workers)]
    if jolt:
        for m in models:
            _load(m, _flat(m) * (1 + jolt))
    opts = [torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.01) for m in models]
    x_outer = _flat(models[0]).clone()
    outer = torch.optim.SGD([x_outer], lr=0.7, momentum=0.9, nesterov=True)
    exchange = _Exchange(codec, x_outer.numel(), workers, feedback) if codec else None
    for t in range(1, steps + 1):
        for i, (m, opt) in enumerate(zip(models, opts)):
            x, y = _batch(teacher, i, workers, t)
            opt.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
        if t % every == 0:
            deltas = [x_outer - _flat(m) for m in models]
            grad = torch.stack(deltas).mean(0) if exchange is None else exchange.mean(deltas)
            x_outer.grad = grad
            outer.step()
            for m in models:
                _load(m, x_outer)
    held = [_batch(teacher, i, workers, 10**6, 512) for i in range(workers)]
    model = _student(kind)
    _load(model, x_outer)
    with torch.no_grad():
        loss = sum(float(nn.functional.cross_entropy(model(x), y)) for x, y in held) / workers
    return x_outer.clone(), loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("linear", "mlp"), default="linear")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = _flat(_student(args.model))
    exact, exact_loss = run(args.model, None)
    travel = float((exact - start).norm())
    header = [args.model, "run", "loss", "vs exact", "distance to exact"]
    rows = [[f"{start.numel()} params", "exact", f"{exact_loss:.6f}", None, None]]
    variants = [("noise floor (x(0) * (1 + 1e-6))", None, False, 1e-6)]
    variants += [(f"{c}, feedback={f}", c, f, 0.0) for c in ("int8", "bf16") for f in (False, True)]
    for label, codec, feedback, jolt in variants:
        x, loss = run(args.model, codec, feedback, jolt=jolt)
        gap = float((x - exact).norm()) / travel
        rows.append([None, label, f"{loss:.6f}", f"{loss - exact_loss:+.1e}", f"{gap:.1e}"])
    print(md_table(header, ["---"] * len(header), rows))


if __name__ == "__main__":
    main()
