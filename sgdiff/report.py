"""What sgdiff did to a model: sites found and rewritten per chain family, and what it left."""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Dict, List, Sequence, Tuple

from sgdiff.fxpasses import ManagerResult
from sgdiff.kernels import registry
from sgdiff.tiers import Tier


@dataclasses.dataclass
class Report:
    tier: Tier
    graphs: int = 0
    counts: Dict[str, int] = dataclasses.field(default_factory=dict)  # family -> rewritten
    found: Dict[str, int] = dataclasses.field(default_factory=dict)  # family -> found
    #: family -> {op -> rewritten}: an op several families use (``layer_norm``: a QK norm, a
    #: bare norm, a cast LayerNorm before a modulation) counted under the family that rewrote it
    family_ops: Dict[str, Dict[str, int]] = dataclasses.field(default_factory=dict)
    skipped: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)
    #: (family, op, reason) -> where in the model the first such site is
    skipped_where: Dict[Tuple[str, str, str], str] = dataclasses.field(default_factory=dict)
    graph_breaks: List[str] = dataclasses.field(default_factory=list)  # torch.compile's reasons
    #: groups of FP8 projections of one input made one GEMM (linear_fp8_siblings; high only)
    merged_projections: int = 0
    #: LayerNorm-modulates that make their FP8 projections' e4m3 rows (layernorm_modulate_linear_fp8; high only)
    folded_norms: int = 0
    #: what first sight chose where an op has implementations of the same bits to choose from
    #: (the gemm family's: cuBLAS and the chain, the fused GEMM's configurations; cat_pad's: the
    #: chain and the one-pass kernel), for the signatures first met during the report's run:
    #: (op, input shapes, chosen, {candidate: µs})
    choices: List[Tuple[str, Tuple[Tuple[int, ...], ...], str, Dict[str, float]]] = dataclasses.field(
        default_factory=list)

    @classmethod
    def from_results(cls, tier: Tier, results: List[ManagerResult], families: List[str],
                     graph_breaks: Sequence[str] = ()) -> "Report":
        report = cls(Tier.parse(tier), graphs=len(results), graph_breaks=list(graph_breaks))
        report.counts = {f: 0 for f in families}
        report.found = {f: 0 for f in families}
        for result in results:
            report.merged_projections += result.merged_projections
            report.folded_norms += result.folded_norms
            for family, r in result.passes.items():
                report.counts[family] = report.counts.get(family, 0) + r.matched_count
                report.found[family] = report.found.get(family, 0) + r.found_count
                for op, n in r.ops.items():
                    by_op = report.family_ops.setdefault(family, {})
                    by_op[op] = by_op.get(op, 0) + n
                report.skipped.extend(tuple(s) for s in r.skipped)
                for s in r.skipped:
                    report.skipped_where.setdefault(tuple(s), s.where)
        return report

    @property
    def ops(self) -> Dict[str, int]:
        """op -> sites rewritten, over every family."""
        total: Dict[str, int] = {}
        for by_op in self.family_ops.values():
            for op, n in by_op.items():
                total[op] = total.get(op, 0) + n
        return total

    def __str__(self) -> str:
        breaks = (f" ({len(self.graph_breaks)} kind(s) of graph break: "
                  + "; ".join(_first_line(b) for b in self.graph_breaks) + ")") if self.graph_breaks else ""
        lines = [f"sgdiff report: quality {self.tier.value}, {self.graphs} graph(s){breaks}",
                 f"  {'family':<18}{'found':>6}{'rewritten':>11}  {'op':<24}contract"]
        for family in self.counts:
            ops = list(self.family_ops.get(family, ())) or ["-"]
            for i, op in enumerate(ops):
                contract = registry.op_def(op).contract.value if op != "-" else ""
                head = (f"  {family:<18}{self.found.get(family, 0):>6}{self.counts[family]:>11}"
                        if i == 0 else " " * 37)
                lines.append(f"{head}  {op:<24}{contract}")
        if self.merged_projections:
            lines.append(f"  {self.merged_projections} group(s) of linear_fp8 projections of one input merged: one "
                         "linear_fp8_siblings GEMM each")
        if self.folded_norms:
            lines.append(f"  {self.folded_norms} LayerNorm-modulate(s) read only by FP8 projections make their e4m3 rows: "
                         "layernorm_modulate_linear_fp8")
        if self.skipped:
            lines.append("  skipped:")
            for (family, op, reason), n in Counter(self.skipped).items():  # first-seen order
                where = self.skipped_where.get((family, op, reason))
                lines.append(f"    {family:<18}{op:<24}{reason}" + (f" (x{n})" if n > 1 else "")
                             + (f"; first at {where}" if where else ""))
        if self.choices:
            lines.append("  chosen at first sight (reference: the eager chain, a GEMM's on cuBLAS; unfused: "
                         "cuBLAS and sgdiff's chain kernel; µs of each candidate):")
            for op, shapes, chosen, times in self.choices:
                shown = " x ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
                lines.append(f"    {op:<24}{shown}: {chosen}  ("
                             + ", ".join(f"{name} {us:.1f}" for name, us in times.items()) + ")")
        return "\n".join(lines)


def _first_line(reason: str) -> str:
    """A graph break's reason in a line: dynamo's headline and its explanation."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    explanation = next((line for line in lines if line.startswith("Explanation:")), "")
    return " ".join(p for p in (lines[0] if lines else "", explanation) if p)
