"""What sgdiff did to a model: sites found and rewritten per chain family, and what it left."""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Dict, List, Tuple

from sgdiff.fxpasses import ManagerResult
from sgdiff.kernels import registry
from sgdiff.tiers import Tier


@dataclasses.dataclass
class Report:
    tier: Tier
    graphs: int = 0
    counts: Dict[str, int] = dataclasses.field(default_factory=dict)  # family -> rewritten
    found: Dict[str, int] = dataclasses.field(default_factory=dict)  # family -> found
    ops: Dict[str, int] = dataclasses.field(default_factory=dict)  # op -> rewritten
    skipped: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)

    @classmethod
    def from_results(cls, tier: Tier, results: List[ManagerResult], families: List[str]) -> "Report":
        report = cls(Tier.parse(tier), graphs=len(results))
        report.counts = {f: 0 for f in families}
        report.found = {f: 0 for f in families}
        for result in results:
            for family, r in result.passes.items():
                report.counts[family] = report.counts.get(family, 0) + r.matched_count
                report.found[family] = report.found.get(family, 0) + r.found_count
                for op, n in r.ops.items():
                    report.ops[op] = report.ops.get(op, 0) + n
                report.skipped.extend(tuple(s) for s in r.skipped)
        return report

    def __str__(self) -> str:
        lines = [f"sgdiff report: quality {self.tier.value}, {self.graphs} graph(s)",
                 f"  {'family':<18}{'found':>6}{'rewritten':>11}  {'op':<24}contract"]
        for family in self.counts:
            ops = [op for op in self.ops if _family_of(op, self) == family] or ["-"]
            for i, op in enumerate(ops):
                contract = registry.op_def(op).contract.value if op != "-" else ""
                head = (f"  {family:<18}{self.found.get(family, 0):>6}{self.counts[family]:>11}"
                        if i == 0 else " " * 37)
                lines.append(f"{head}  {op:<24}{contract}")
        if self.skipped:
            lines.append("  skipped:")
            for (family, op, reason), n in Counter(self.skipped).items():  # first-seen order
                lines.append(f"    {family:<18}{op:<24}{reason}" + (f" (x{n})" if n > 1 else ""))
        return "\n".join(lines)


def _family_of(op: str, report: Report) -> str:
    from sgdiff import patterns

    for p in patterns.all_patterns():
        if p.op == op:
            return p.family
    return ""
