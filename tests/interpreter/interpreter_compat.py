"""Triton's CPU interpreter made cheaper to call into, for these tests only (Triton internals).

The interpreter swaps ``triton.language``'s builtins for host implementations at every launch
and again at every call of a ``@triton.jit`` helper inside a kernel, each time by walking the
packages with ``inspect.getmembers`` (about 90 members, sorted) to find the builtins. Kernels
built of many small helpers (``cuda_math``'s exact roundings) spent most of their interpreted
time there: LayerNorm-modulate's bound launch on 24 rows of 128 took 18 s, 7 s with this.

``install()`` lists each package's builtins once, before any launch, and patches exactly
those the interpreter's walk would patch: the members still unpatched (inside a kernel the
packages are already patched, and the walk finds no builtin left). The interpreter's results
are unchanged; only the walk is skipped. Where Triton's interpreter is not laid out as expected
nothing is installed and the interpreter runs as it comes.
"""
import inspect
import logging

log = logging.getLogger("sgdiff")


def install() -> bool:
    try:
        import triton.language as tl
        from triton.runtime import interpreter
        walk, patch_attr = interpreter._patch_builtin, interpreter._patch_attr
        is_builtin = tl.core.is_builtin
    except (ImportError, AttributeError) as e:
        log.info("Triton's interpreter left as it is (%s)", e)
        return False
    if getattr(walk, "lists_builtins_once", False):
        return True
    packages = (tl, tl.tensor, tl.math, tl.core, tl.core.tensor, tl.core.tensor_descriptor_base)
    builtins = {id(p): [(n, m) for n, m in inspect.getmembers(p) if is_builtin(m)] for p in packages}

    def patch_builtins(pkg, builder, scope):
        members = builtins.get(id(pkg))
        if members is None:
            return walk(pkg, builder, scope)
        for name, member in members:
            if getattr(pkg, name, None) is member:  # not patched yet: the walk would patch it
                patch_attr(pkg, name, member, builder, scope)

    patch_builtins.lists_builtins_once = True
    interpreter._patch_builtin = patch_builtins
    return True
