"""DAPO overlong reward shaping (Soft Overlong Punishment).

DAPO Eq. 13, with L_max = ``max_response_length`` and L_cache = ``buffer_len``:

    R_length(y) = 0                                   if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                  if L_max < |y|

scaled by ``penalty_factor`` (verl's ``overlong_buffer.penalty_factor``) and added to the verifier's score.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["overlong_penalty"]


def overlong_penalty(
    response_lengths: torch.Tensor | Sequence[int] | Sequence[float],
    max_response_length: int,
    buffer_len: int,
    penalty_factor: float,
) -> torch.Tensor:
    """Length penalty of DAPO Eq. 13, linear inside the last ``buffer_len`` tokens before ``max_response_length``.

    ``penalty = clamp(-(|y| - (L_max - L_cache)) / L_cache * penalty_factor, -penalty_factor, 0)``: 0 up to
    ``L_max - L_cache`` tokens, ``-penalty_factor`` at ``L_max`` tokens and beyond.

    Args:
        response_lengths: ``(B,)`` response lengths in tokens (int or float tensor, or a sequence of numbers).
        max_response_length: L_max, tokens.
        buffer_len: L_cache, tokens; ``0 < buffer_len <= max_response_length``.
        penalty_factor: penalty at ``L_max`` (DAPO: 1.0); ``>= 0``.

    Returns:
        ``(B,)`` float32 penalties in ``[-penalty_factor, 0]``, on the device of ``response_lengths``.

    Raises:
        ValueError: ``buffer_len <= 0``, ``buffer_len > max_response_length`` or ``penalty_factor < 0``.
    """
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(
            f"buffer_len must satisfy 0 < buffer_len <= max_response_length ({max_response_length}), got {buffer_len}"
        )
    if not penalty_factor >= 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    lengths = torch.as_tensor(response_lengths).to(torch.float32)

    expected_len = max_response_length - buffer_len  # L_max - L_cache: longest response with no penalty
    exceed_len = lengths - expected_len
    penalty = -exceed_len / buffer_len * penalty_factor
    return torch.clamp(penalty, min=-penalty_factor, max=0.0)
