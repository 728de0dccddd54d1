"""Named hook points, in the spirit of TransformerLens.

A :class:`HookPoint` is an identity module placed where an activation worth reading is
computed (``blocks.0.attn.hook_q`` / ``hook_k`` / ``hook_v``, ``blocks.0.attn.hook_scores``,
``blocks.0.attn.hook_pattern``...). Register a forward hook on it to read or edit the activation;
:func:`run_with_cache` records every hook point for one forward pass. Attention layers check
:attr:`HookPoint.active` on ``hook_scores`` and ``hook_pattern`` and take the explicit (materialised)
path only when someone listens there, so unused capture costs nothing (queries, keys and values
are captured on the fused path).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

__all__ = ["HookPoint", "hook_points", "capture_hooks", "run_with_cache"]


class HookPoint(nn.Module):
    """Identity; exists so that hooks can be attached to a named activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        """True when at least one forward (pre-)hook is registered here."""
        return bool(self._forward_hooks) or bool(self._forward_pre_hooks)


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` by its qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}


@contextlib.contextmanager
def capture_hooks(model: nn.Module, names: Iterable[str] | None = None,
                  filter: Callable[[str], bool] | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Record the (detached) activations of the chosen hook points into the yielded dict.

    ``names``: an exact name or a list of them (default: all); ``filter``: a predicate on names. Unknown names raise
    ``KeyError`` listing the available ones.
    """
    points = hook_points(model)
    if names is not None:
        names = [names] if isinstance(names, str) else list(names)     # one name, not its characters
        missing = [n for n in names if n not in points]
        if missing:
            raise KeyError(f"unknown hook point(s) {missing}; available: {sorted(points)}")
        points = {n: points[n] for n in names}
    if filter is not None:
        points = {n: p for n, p in points.items() if filter(n)}
    cache: dict[str, torch.Tensor] = {}
    handles = []
    for name, point in points.items():
        def hook(_module, _inputs, output, _name=name):
            cache[_name] = output.detach()
        handles.append(point.register_forward_hook(hook))
    try:
        yield cache
    finally:
        for h in handles:
            h.remove()


def run_with_cache(model: nn.Module, *args, names=None, filter=None, **kwargs):
    """``(output, cache)``: one forward pass with every chosen hook point recorded."""
    with capture_hooks(model, names=names, filter=filter) as cache:
        out = model(*args, **kwargs)
    return out, cache
