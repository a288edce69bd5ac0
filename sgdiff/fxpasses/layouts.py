"""Hand sgdiff's convolutions channels-last input where an sgdiff op writes it.

cuDNN runs a half-precision convolution of NCHW tensors as an NHWC one between two transposes
of its own (``nchwToNhwcKernel`` before, ``nhwcToNchwKernel`` after: 9 of a Flux VAE decode's
39 ms on an H100). Given a channels-last input it runs the same NHWC kernel without them, and
the output is bitwise the same (every 2-d and 3-d convolution of the Flux and Wan VAEs, with and
without bias, on an H100: ``bench/results/runs/conv-channels-last-probe-h100-a6b6c58.txt``). Where the convolution's input comes from
an op that can write channels-last at no cost (``group_norm``, ``conv_group_norm``,
``upsample_nearest``: their last pass writes the output anyway) and goes to an op that runs
the convolution itself and can take its channels-last output (``conv_group_norm``,
``conv_residual``, ``biased_conv``: their bias's pass writes eager's layout), this pass sets
the producer's ``channels_last`` and the consumers' ``conv_as_contiguous``; a plain biased
convolution reading it becomes ``biased_conv``. Nothing else reads the producer's output, so no
op sees a layout eager did not give it; each consumer's first sight still verifies its output
against the convolution of a contiguous input.

Half-precision CUDA tensors of static shapes only (cuDNN's float32 convolutions of NCHW tensors
need not run the NHWC kernel; a dynamic shape's layout question would guard the graph).
"""
from __future__ import annotations

import logging
from typing import Dict, Iterable

import torch
from torch import fx

from sgdiff import _compat
from sgdiff.fxpasses.rewrite import _is_symbolic
from sgdiff.kernels import registry
from sgdiff.kernels.layout import as_channels_last

log = logging.getLogger("sgdiff")

PRODUCERS = ("group_norm", "conv_group_norm", "upsample_nearest")  # ops with a ``channels_last`` argument
CONSUMERS = ("conv_group_norm", "conv_residual", "biased_conv")  # ops with ``conv_as_contiguous``: x their first
DTYPES = (torch.float16, torch.bfloat16)
aten = torch.ops.aten


def _ops(names: Iterable[str]) -> Dict[object, str]:
    found = {}
    for name in names:
        try:
            found[registry.op_def(name).load()] = name
        except (KeyError, ImportError, AttributeError):
            continue
    return found


def _set(node: fx.Node, name: str, value) -> None:
    """Set the op argument ``name`` of ``node`` (positional, defaults filled up to it)."""
    arguments = _compat.op_schema(node.target).arguments
    index = [a.name for a in arguments].index(name)
    args = list(node.args)
    args += [a.default_value for a in arguments[len(args):index + 1]]
    args[index] = value
    node.args = tuple(args)


def _plain_biased_conv(node: fx.Node) -> bool:
    """``aten.convolution`` of a bias, not transposed, one group (cuDNN's, not a depthwise kernel)."""
    if node.op != "call_function" or node.target is not aten.convolution.default or node.kwargs:
        return False
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = node.args
    return isinstance(bias, fx.Node) and not transposed and not any(output_padding) and groups == 1


def _as_biased_conv(graph: fx.Graph, node: fx.Node) -> None:
    """Replace a plain biased convolution by sgdiff::biased_conv taking its input as contiguous."""
    x, weight, bias, stride, padding, dilation, _, _, groups = node.args
    with graph.inserting_before(node):
        new = graph.call_function(registry.op_def("biased_conv").load(),
                                  (x, weight, bias, list(stride), list(padding), list(dilation), groups, True))
    new.meta.update(node.meta)  # the same value, in eager's layout
    node.replace_all_uses_with(new)
    graph.erase_node(node)


def channels_last_into_convolutions(gm: fx.GraphModule, devices=("cuda",)) -> int:
    """Apply the pass to ``gm`` in place; returns how many producers now write channels-last."""
    producers, consumers = _ops(PRODUCERS), _ops(CONSUMERS)
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in producers or node.kwargs:
            continue
        val = node.meta.get("val")
        if not (isinstance(val, torch.Tensor) and val.dim() in (4, 5) and val.device.type in devices
                and val.dtype in DTYPES and not _is_symbolic(val) and val.is_contiguous()):
            continue
        users = list(node.users)
        if not users or not all((u.target in consumers or _plain_biased_conv(u)) and u.args[0] is node
                                and node not in u.args[1:] for u in users):
            continue
        mode = _compat.fake_mode_of([val])
        if mode is None:
            continue
        with mode:
            node.meta["val"] = as_channels_last(val)
        _set(node, "channels_last", True)
        for user in users:  # their outputs keep eager's layout
            if user.target in consumers:
                _set(user, "conv_as_contiguous", True)
            else:
                _as_biased_conv(gm.graph, user)
        changed += 1
    if changed:
        gm.recompile()
        log.info("sgdiff: %d ops write channels-last input for the convolutions that read them", changed)
    return changed
