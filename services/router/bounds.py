"""The numbers a route request may carry: far above any model's, and far below what overflows
the router's compiled kernels (int64 arithmetic over blocks · block size and prompt lengths,
which would wrap silently) or loses a float's integers. The router checks each request it is
asked to place (`llm.v1.route`); the queue checks each one it takes from its stream, so that one
no router can place is refused once instead of being put back in line for ever."""

from __future__ import annotations

from tokenyard.shared.schemas import AdmittedRequest

MAX_BLOCK_SIZE = 1 << 16
MAX_PROMPT_LEN = 1 << 40
"""Bounds of a route request's numbers (`check_inputs`): far above any model's, and far below
what overflows the compiled kernels' int64 (blocks · B, Q + N) or loses a float's integers."""


def check_inputs(req: AdmittedRequest) -> None:
    """ValueError, naming the field, for a request whose numbers the kernels cannot take: a
    block size below 1 or over MAX_BLOCK_SIZE, a prompt length below 0 or over MAX_PROMPT_LEN,
    or a chain of more blocks than MAX_PROMPT_LEN tokens (admission never makes one; a
    request on `llm.v1.route` from elsewhere may: int64 arithmetic would wrap silently)."""
    if not 1 <= req.block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size {req.block_size} is not in [1, {MAX_BLOCK_SIZE}]")
    if not 0 <= req.prompt_len <= MAX_PROMPT_LEN:
        raise ValueError(f"prompt_len {req.prompt_len} is not in [0, {MAX_PROMPT_LEN}]")
    if len(req.block_hashes) * req.block_size > MAX_PROMPT_LEN:
        raise ValueError(f"{len(req.block_hashes)} blocks of {req.block_size} tokens exceed {MAX_PROMPT_LEN}")
