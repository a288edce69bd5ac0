"""Call the ATen ops of an executed graph through their Python bindings, not ``OpOverload``.

``torch.ops.aten.view.default(x, size)`` and ``x.view(size)`` run the same ATen kernel on the
same arguments; the first goes through ``OpOverload.__call__`` (about 3 µs of host time a call
on a CPU core), the second through the binding (about 1 µs). A DiT's graph is mostly such
calls (views, weight transposes, GEMMs: 80% of a Sana block's ATen calls), and without CUDA
graphs a step of a small model is as long as its host time. The results are the same tensors:
only ops whose arguments the binding takes exactly as the schema does are retargeted, and
anything else (scalars where promotion could differ, unexpected keyword arguments) keeps its
call.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import fx

from sgdiff import _compat

aten = torch.ops.aten

# overload -> (how to call it, the kinds of its positional arguments, keyword arguments it may
# carry): "N" a tensor node, "L" a list of sizes or dims, "s" an int, "T" a list of tensor nodes.
# A method name is called on the first argument (``call_method``), a callable is called as is.
DIRECT: Dict[object, Tuple[object, Tuple[str, ...], Tuple[str, ...]]] = {
    aten.view.default: ("view", ("NL",), ()),
    aten.t.default: ("t", ("N",), ()),
    aten.unsqueeze.default: ("unsqueeze", ("Ns",), ()),
    aten.transpose.int: ("transpose", ("Nss",), ()),
    aten.expand.default: ("expand", ("NL",), ()),
    aten.permute.default: ("permute", ("NL",), ()),
    aten.split.Tensor: ("split", ("Ns", "Nss"), ()),
    aten.addmm.default: (torch.addmm, ("NNN",), ()),
    aten.mm.default: (torch.mm, ("NN",), ()),
    aten.bmm.default: (torch.bmm, ("NN",), ()),
    aten.cat.default: (torch.cat, ("T", "Ts"), ()),
    aten.mul.Tensor: (torch.mul, ("NN",), ()),
    aten.add.Tensor: (torch.add, ("NN",), ()),
    aten.silu.default: (F.silu, ("N",), ()),
    aten.gelu.default: (F.gelu, ("N",), ("approximate",)),
    aten.clone.default: (torch.clone, ("N",), ("memory_format",)),
}


def direct_aten_calls(gm: fx.GraphModule) -> int:
    """Retarget the ATen calls of ``gm`` that :data:`DIRECT` names; returns how many."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        how = _direct(node)
        if how is None:
            continue
        if isinstance(how, str):
            node.op, node.target = "call_method", how
        else:
            node.target = how
        count += 1
    if count:
        gm.recompile()
    return count


def _direct(node: fx.Node) -> Optional[object]:
    entry = DIRECT.get(node.target) if _compat.is_op_overload(node.target) else None
    if entry is None:
        return None
    how, kinds, kwargs = entry
    if any(k not in kwargs for k in node.kwargs) or _kinds(node.args) not in kinds:
        return None
    return how


def _kinds(args) -> str:
    return "".join(_kind(a) for a in args)


def _kind(a) -> str:
    if isinstance(a, fx.Node):
        return "N"
    if isinstance(a, bool):  # a flag, never a size
        return "?"
    if isinstance(a, int):
        return "s"
    if isinstance(a, (list, tuple)):
        if a and all(isinstance(x, fx.Node) for x in a):
            return "T"
        if all(isinstance(x, (int, fx.Node)) and not isinstance(x, bool) for x in a):
            return "L"
    return "?"

