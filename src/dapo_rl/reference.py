"""The reference policy of the KL term (`algorithm.use_kl_loss`), and ProRL's periodic reset of it.

DAPO has no KL term. ProRL (Liu et al. 2025, "ProRL: Prolonged Reinforcement Learning Expands Reasoning Boundaries",
arXiv 2505.24864, Sec. 3.2) keeps one for stability over thousands of steps and, when the KL term starts to
dominate, hard-resets the reference to the current policy and reinitialises the optimizer's state;
`algorithm.ref_reset_freq` does that every N actor updates.

The reference is a frozen copy of the actor's module: `copy.deepcopy` in one process; under FSDP2 a second sharded
module from the same loader, with the same placements, so a reset is a shard-by-shard copy on every rank and the
reference costs one more copy of the (sharded) weights, no optimizer state. LoRA actors are refused for now (the
reference would be the base with the adapters off, and a reset would have to merge them).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

__all__ = ["ReferencePolicy"]


class ReferencePolicy:
    """A frozen copy of a policy module (see the module docstring).

    Args:
        model: the actor's module, whose current weights the reference starts from.
        build: under FSDP2, a function that builds a second sharded module like `model` (with or without its
            weights: they are copied from `model`); None in one process (the reference is `copy.deepcopy(model)`).
    """

    def __init__(self, model: torch.nn.Module, build: Callable[[], torch.nn.Module] | None = None):
        if build is None:
            self.model = copy.deepcopy(model)
        else:
            self.model = build()
            self.reset_from(model)
        self.model.requires_grad_(False)
        self.model.eval()

    @torch.no_grad()
    def reset_from(self, model: torch.nn.Module) -> None:
        """Copy `model`'s current weights and buffers into the reference (under FSDP2 each rank its own shards: the
        two modules are sharded alike, so no communication).

        Raises:
            ValueError: the two modules' state dicts do not have the same names and shapes.
        """
        src, dst = model.state_dict(), self.model.state_dict()
        if src.keys() != dst.keys():
            raise ValueError(
                f"the reference's weights {sorted(dst)[:3]}... are not the policy's {sorted(src)[:3]}..."
            )
        for name, t in dst.items():
            s = src[name]
            if s.shape != t.shape:
                raise ValueError(
                    f"{name}: the policy's shape {tuple(s.shape)} is not the reference's {tuple(t.shape)}"
                )
            local_t = t.to_local() if hasattr(t, "to_local") else t
            local_t.copy_(s.to_local() if hasattr(s, "to_local") else s)
