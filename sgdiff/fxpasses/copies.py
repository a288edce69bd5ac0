"""Drop copies that change nothing: a ``clone`` of a freshly computed tensor nothing else reads;
and make a traced ``.contiguous()`` copy only where the tensor is not contiguous.

``nn.Dropout`` in eval mode traces to ``clone``: diffusers' attention ``to_out[1]`` and its
feed-forwards' dropouts copy every block's activations once more (38 copies a Flux.1-dev step,
a device-to-device memcpy each; 40 a Sana step). Where the input is the whole output of an op
(not a view into another tensor's storage), dense, read by nothing but the clone, and the clone
keeps its strides, the clone's output and its input are the same tensor to every op after it (a reshape of such
an output too, where it covers all of it and nothing else reads it):
same values, same strides, a storage of its own starting at offset 0 (the caching allocator's
alignment). The pass makes the clone's users read the input instead.
"""
from __future__ import annotations

import logging

import torch
from torch import fx

from sgdiff import _compat
from sgdiff.kernels.layout import is_dense

log = logging.getLogger("sgdiff")
aten = torch.ops.aten


def op_output(node: fx.Node):
    """``(fresh, alias)``: whether ``node`` is an op's single output, and whether it is a view."""
    target = node.target
    schema = _compat.op_schema(target) if node.op == "call_function" and _compat.is_op_overload(target) else None
    if schema is None or len(schema.returns) != 1:
        return False, False
    alias = schema.returns[0].alias_info is not None
    return not alias, alias


def _owns_storage(node: fx.Node, numel: int) -> bool:
    """Whether ``node`` is a fresh op output, or a chain of views of one that each nothing else
    reads, covering all ``numel`` elements of that output (a reshape of a linear's output)."""
    while True:
        fresh, alias = op_output(node)
        if fresh:
            base = node.meta.get("val")
            return isinstance(base, torch.Tensor) and base.numel() == numel and base.storage_offset() == 0
        if not alias or not isinstance(node.args[0], fx.Node) or len(node.args[0].users) != 1:
            return False
        node = node.args[0]


def _same_tensor(src: torch.Tensor, out: torch.Tensor) -> bool:
    if any(isinstance(s, torch.SymInt) for s in (*src.shape, *src.stride(), *out.stride())):
        return False
    return (src.dtype == out.dtype and src.device == out.device and tuple(src.shape) == tuple(out.shape)
            and tuple(src.stride()) == tuple(out.stride()) and src.storage_offset() == 0
            and is_dense(src.shape, src.stride()))


def drop_copies(gm: fx.GraphModule) -> int:
    """Drop every such clone of ``gm`` (in place); returns how many."""
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.clone.default:
            continue
        src = node.args[0]
        if not isinstance(src, fx.Node) or len(src.users) != 1:
            continue
        s, c = src.meta.get("val"), node.meta.get("val")
        if not (isinstance(s, torch.Tensor) and isinstance(c, torch.Tensor) and _same_tensor(s, c)
                and _owns_storage(src, s.numel())):
            continue
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        dropped += 1
    if dropped:
        gm.graph.lint()
        gm.recompile()
        log.info("sgdiff: dropped %d copies that change nothing (eval-mode dropout)", dropped)
    return dropped


def lazy_contiguous(gm: fx.GraphModule) -> int:
    """Turn each ``clone(x, memory_format=torch.contiguous_format)`` of ``gm`` into ``x.contiguous()``
    (in place; returns how many): a copy only where ``x`` is not contiguous when the graph runs.

    ``x.contiguous()`` traces to that clone wherever the trace's fake tensor was not contiguous,
    and the fake's strides can be wrong: on CUDA, a convolution's fake output is channels-last
    where cuDNN writes it contiguous, so the GroupNorm after every convolution of a VAE decoder
    (ATen's ``group_norm`` makes its input contiguous) copied a contiguous tensor (ten copies,
    1 ms of a Flux VAE decode at 1024² on an H200) that eager never copies. The graph is
    functional, so the result aliasing ``x`` changes nothing unless either is a graph output
    or ``x`` an input: those keep their clone.
    """
    outputs = set(next(n for n in reversed(gm.graph.nodes) if n.op == "output").all_input_nodes)
    count = 0
    for node in list(gm.graph.nodes):
        if (node.op != "call_function" or node.target is not aten.clone.default or len(node.args) != 1
                or node.kwargs != {"memory_format": torch.contiguous_format}):
            continue
        src = node.args[0]
        if not isinstance(src, fx.Node) or src.op == "placeholder" or node in outputs or src in outputs:
            continue
        node.op, node.target, node.kwargs = "call_method", "contiguous", {}
        count += 1
    if count:
        gm.recompile()
        log.debug("sgdiff: %d contiguous copies made lazy", count)
    return count
