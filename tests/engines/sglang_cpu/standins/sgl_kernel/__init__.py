"""Stand-in for ``sgl_kernel`` (SGLang's native kernel package; its CPU build is not on PyPI),
loaded into every SGLang process of the real-engine suite through ``PYTHONPATH``.

It registers no ``torch.ops.sgl_kernel`` op, so SGLang's CPU model path takes its own
``forward_native`` code for RMSNorm, rotary, SiLU, linear and attention (``torch_native``).
It provides:

- ``assign_req_to_token_pool_cpu``, in pure torch: the index copy that
  ``srt/mem_cache/allocation.py`` (``assign_req_to_token_pool_func``, imported at module level
  ``if _is_cpu``) runs instead of its triton kernel ``assign_req_to_token_pool``: each
  request's new slots ``out_cache_loc[offset : offset + end - start]`` go to
  ``req_to_token[req_pool_indices[i], start:end]``. No model math.
- every other name SGLang's CPU path imports from it at module level (KV copies, speculative
  decoding ops): each raises ``NotImplementedError`` if called, after recording the call in the
  file named by ``$RADIXLINK_STANDIN_CALLS`` (the suite fails when that file is not empty).
"""

from __future__ import annotations

import torch
from sglang_cpu_standins import raising


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[o_i : o_i + n_i]``
    with ``o_i`` the sum of the earlier requests' ``n_j = end[j] - start[j]``."""
    del pool_len  # NOTE: the kernel's row stride; torch indexing knows it
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    offset = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        num = end - start
        if num > 0:
            req_to_token[row, start:end] = out_cache_loc[offset:offset + num].to(
                req_to_token.dtype)
        offset += num


# Imported at module level by SGLang's CPU path, never called by a text model without
# speculative decoding (sglang/kernels/ops/kvcache/cache_move.py: KV moves; spec_tree.py and
# srt/speculative/*: EAGLE trees). Each records its call and raises.
copy_all_layer_kv_cache_cpu = raising("sgl_kernel.copy_all_layer_kv_cache_cpu")
build_tree_kernel_efficient_cpu = raising("sgl_kernel.build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = raising("sgl_kernel.verify_tree_greedy_cpu")
assign_draft_cache_locs_contiguous_cpu = raising(
    "sgl_kernel.assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = raising("sgl_kernel.assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = raising("sgl_kernel.fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = raising("sgl_kernel.fill_bonus_tokens_cpu")
