"""Graph passes: the family rewrites, the quality-aware pass manager, and what readies a
rewritten graph to run (launch lowering, direct ATen calls, CUDA graphs)."""
from sgdiff.fxpasses.manager import ManagerResult, PassManager, PatternPass
from sgdiff.fxpasses.rewrite import PassResult, Skip

__all__ = ["PassManager", "PatternPass", "ManagerResult", "PassResult", "Skip"]
