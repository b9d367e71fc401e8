"""The ops never reach the speed layer: a static walk over the imports.

Every module under minichain/functions, minichain/links and
minichain/optimizers, and variable.py and function_node.py, is parsed with
``ast``; every import it makes (at module level or inside a function) is
followed through minichain's own modules, transitively. None of them may
reach ``minichain.kernels.<anything>`` (the NumPy, CUDA and oneDNN kernels)
or ``minichain.host`` (the kernels' thread scope). The registry,
``minichain.kernels`` itself, is imported by the engine only
(function_node.py and optimizer.py) and must itself import no kernel module.
"""
import ast
import functools
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# Edges the walk does not follow, each with its reason.
EXEMPT = {
    # backend.__getattr__ hands out host's names (backend.set_blas_threads)
    # to programs that ask for them; it imports host only then, and no op
    # asks.
    ('minichain.backend', 'minichain.host'),
}
REGISTRY = 'minichain.kernels'
REGISTRY_USERS = {'minichain.function_node', 'minichain.optimizer'}


def _path(module):
    """The file of a minichain module, or None (not minichain's, or not a
    module but a name inside one)."""
    if module != 'minichain' and not module.startswith('minichain.'):
        return None
    base = os.path.join(ROOT, *module.split('.'))
    for path in (base + '.py', os.path.join(base, '__init__.py')):
        if os.path.isfile(path):
            return path
    return None


@functools.lru_cache(maxsize=None)
def imports_of(module):
    """The minichain modules that ``module``'s import statements name.

    ``from minichain import x`` counts as minichain.x when that is a module
    and is not followed otherwise: the root package is the facade that
    imports every layer, on purpose, and is never what an op asks for.
    """
    path = _path(module)
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    is_package = path.endswith('__init__.py')
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split('.')
                # ``import a.b.c`` imports a, a.b and a.b.c
                found.update('.'.join(parts[:i])
                             for i in range(2, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:  # relative: from the module's own package
                pkg = module.split('.')
                pkg = pkg[:len(pkg) - node.level + (1 if is_package else 0)]
                base = '.'.join(pkg + ([base] if base else []))
            if base != 'minichain':
                found.add(base)
            for alias in node.names:
                found.add(base + '.' + alias.name)
    return {m for m in found if _path(m) is not None and m != 'minichain'}


def reach(start):
    """{module: the chain of imports from ``start`` to it}."""
    chains = {start: (start,)}
    todo = [start]
    while todo:
        module = todo.pop()
        for target in sorted(imports_of(module)):
            if (module, target) in EXEMPT or target in chains:
                continue
            chains[target] = chains[module] + (target,)
            todo.append(target)
    return chains


def _modules_under(folder):
    out = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
        for name in sorted(files):
            if name.endswith('.py'):
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
                mod = rel[:-3].replace(os.sep, '.')
                out.append(mod[:-len('.__init__')]
                           if mod.endswith('.__init__') else mod)
    return sorted(out)


OPS = (_modules_under('minichain/functions') + _modules_under(
    'minichain/links') + _modules_under('minichain/optimizers')
    + ['minichain.variable', 'minichain.function_node'])


def forbidden(module):
    return module.startswith(REGISTRY + '.') or module == 'minichain.host'


@pytest.mark.parametrize('start', OPS)
def test_no_op_module_reaches_the_speed_layer(start):
    bad = {m: c for m, c in reach(start).items() if forbidden(m)}
    assert not bad, '{} reaches the speed layer: {}'.format(
        start, '; '.join(' -> '.join(c) for c in bad.values()))


def test_the_registry_imports_no_kernel_at_import_time():
    assert not any(forbidden(m) for m in reach(REGISTRY)), reach(REGISTRY)


def test_only_the_engine_imports_the_registry():
    users = set()
    for start in OPS:
        for module in reach(start):
            if REGISTRY in imports_of(module):
                users.add(module)
    assert users == REGISTRY_USERS


def test_the_walk_sees_an_import_of_the_speed_layer():
    """The negative control: the kernels' own modules do reach it (through
    ``from minichain.kernels.numpy import _cpu_kernels``), and so would an
    op that imported one."""
    chains = reach('minichain.kernels.numpy.basic_math')
    assert chains['minichain.kernels.numpy._cpu_kernels'] == (
        'minichain.kernels.numpy.basic_math',
        'minichain.kernels.numpy._cpu_kernels')
    assert 'minichain.host' in chains
    assert len(OPS) > 20 and 'minichain.functions.activation' in OPS


def test_a_function_level_import_counts(tmp_path, monkeypatch):
    """An import inside a function body is followed like one at the top."""
    pkg = tmp_path / 'minichain'
    (pkg / 'kernels').mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    (pkg / 'kernels' / '__init__.py').write_text('')
    (pkg / 'kernels' / 'fast.py').write_text('')
    (pkg / 'op.py').write_text(
        'def forward(x):\n    from .kernels import fast\n    return x\n')
    monkeypatch.setattr(__import__(__name__, fromlist=['ROOT']), 'ROOT',
                        str(tmp_path))
    imports_of.cache_clear()
    try:
        assert 'minichain.kernels.fast' in reach('minichain.op')
    finally:
        imports_of.cache_clear()
