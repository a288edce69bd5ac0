"""The source's structure, read from its imports: layers import one way (nothing imports a
layer above its own, so no cycle between subpackages), private torch and Triton APIs sit in
compat modules only, nothing in ``sgdiff`` imports the bench or the tests, and no source file
is longer than 600 lines."""
import ast
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# lowest first: a module imports only from its own layer and those below it
LAYERS = [("sgdiff.tiers", "sgdiff._compat"), ("sgdiff.kernels",), ("sgdiff.patterns",), ("sgdiff.fxpasses",),
          ("sgdiff",)]
PRIVATE = re.compile(r"\btorch\._(?!dynamo\.(?:config|reset)\b|inductor\.config\b)[A-Za-z]"
                     r"|\btriton\.(?:compiler|backends|runtime\.jit|knobs)\b|\.packed_metadata\b")


def _sources(*folders):
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _module(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _layer(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer")


def _imports(path: pathlib.Path):
    """``(line, module)`` for every import in ``path``, relative ones resolved, inside functions too."""
    module = _module(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            if name != "sgdiff":  # `from sgdiff import _compat`: the module named, not the package's API
                yield node.lineno, name
            for a in node.names:  # `from sgdiff.kernels import dispatch` imports a module
                yield node.lineno, f"{name}.{a.name}"


def _code_lines(source: str):
    """Each line's code with its strings and comments left out."""
    lines = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER):
            lines[tok.start[0]] = lines.get(tok.start[0], "") + " " + tok.string
    return lines


def _known(name: str) -> bool:
    return (ROOT / (name.replace(".", "/") + ".py")).exists() or (ROOT / name.replace(".", "/")).is_dir()


@pytest.mark.parametrize("path", _sources("sgdiff"), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_imports_a_layer_above_its_own(path):
    module = _module(path)
    own = _layer(module)
    upward = [f"line {line}: {name}" for line, name in _imports(path)
              if name.startswith("sgdiff") and _known(name) and _layer(name) > own]
    assert not upward, f"{module} (layer {LAYERS[own]}) imports above itself: {upward}"
    assert not [name for _, name in _imports(path) if name.split(".")[0] in ("bench", "tests")]


def test_the_layers_admit_no_cycle_between_subpackages():
    """What the layer test implies, checked as itself: package-level import edges have no cycle."""
    edges = {}
    for path in _sources("sgdiff"):
        src = ".".join(_module(path).split(".")[:2])
        for _, name in _imports(path):
            dst = ".".join(name.split(".")[:2])
            if name.startswith("sgdiff.") and _known(name) and dst != src:
                edges.setdefault(src, set()).add(dst)

    def reaches(a, b, seen=()):
        return any(n == b or (n not in seen and reaches(n, b, (*seen, n))) for n in edges.get(a, ()))

    cycles = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if reaches(b, a))
    assert not cycles, cycles


@pytest.mark.parametrize("path", _sources("sgdiff", "bench"), ids=lambda p: str(p.relative_to(ROOT)))
def test_private_apis_only_in_compat_modules(path):
    if "compat" in path.name:
        return
    found = [f"line {n}: {code.strip()}" for n, code in _code_lines(path.read_text()).items()
             if PRIVATE.search(code.replace(" . ", ".").replace(" .", ".").replace(". ", "."))]
    assert not found, f"{path.relative_to(ROOT)} uses private APIs outside a compat module: {found}"


@pytest.mark.parametrize("path", _sources("sgdiff", "bench", "tests"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_file_over_600_lines(path):
    assert path.read_text().count("\n") <= 600


def test_the_checks_see_what_they_check():
    """Near misses: an upward import and a private API are found where they are."""
    assert _layer("sgdiff.kernels.triton.rope") < _layer("sgdiff.patterns.rope") < _layer("sgdiff.backend")
    assert ("sgdiff.kernels.registry" in {name for _, name in _imports(ROOT / "sgdiff/fxpasses/rewrite.py")})
    assert PRIVATE.search("torch._C._cuda_getDevice()") and not PRIVATE.search("torch.cuda.current_device()")
    assert any(PRIVATE.search(c.replace(" . ", ".").replace(" .", ".").replace(". ", "."))
               for c in _code_lines((ROOT / "sgdiff/_compat.py").read_text()).values())
