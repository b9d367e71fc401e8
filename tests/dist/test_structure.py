"""minichain's structure as tests: no import circle, and no module of
minichain.dist reaching into another module's private members.

A student reads a module alone only if what it uses of others is their
public interface; an import circle means two modules cannot be read (or
loaded) one before the other. Imports inside functions count too: a lazy
import hides a circle from Python, not from the reader.
"""
import ast
import os

import minichain

PACKAGE = os.path.dirname(os.path.abspath(minichain.__file__))
ROOT = os.path.dirname(PACKAGE)
DIST = os.path.join(PACKAGE, 'dist')

# Private names of Python's own types that are their public interface
# (namedtuple's _replace, os._exit).
STDLIB_PRIVATE = {'_exit', '_replace', '_asdict', '_fields', '_make'}

# What is left to clean up, file -> private names it reaches for in other
# modules. Must shrink to empty; an entry no longer needed fails too.
KNOWN_PRIVATE = {
    'minichain/dist/averaging/after_backward.py': {'_multi_node_mean_grad'},
    'minichain/dist/averaging/overlap.py': {'_bucket_transport',
        '_bucket_wire', '_layout_extra'},
    'minichain/dist/averaging/sharded.py': {'_plan_grads'},
    'minichain/dist/batch_normalization.py': {'_channel_shape', '_dtype',
        '_header', '_initialize', '_wire'},
    'minichain/dist/communicator_base.py': {'_header'},
    'minichain/dist/datasets.py': {'_header', '_wire'},
    'minichain/dist/flat.py': {'_wire'},
    'minichain/dist/guards/safety.py': {'_wire'},
    'minichain/dist/hierarchical.py': {'_abort_nccl', '_destroy_nccl',
        '_wire'},
    'minichain/dist/naive.py': {'_wire'},
    'minichain/dist/pure_nccl.py': {'_buffers', '_check_allreduce',
        '_plan_grads', '_wire'},
    'minichain/dist/ring.py': {'_bucket_wire', '_wire'},
    'minichain/dist/transports/collectives.py': {'_wire'},
    'minichain/dist/transports/nccl_buckets.py': {'_abort_nccl',
        '_bucket_inter_wire', '_bucket_wire', '_init_nccl', '_nccl_comm',
        '_sum_wire', '_wait_in_flight', '_wait_nccl', '_wire_dtype'},
}

# Import circles not yet broken, each as a sorted tuple of modules.
KNOWN_CIRCLES = {
    ('minichain.dist.hierarchical', 'minichain.dist.pure_nccl',
     'minichain.dist.transports.nccl_buckets'),
}


def _modules(top):
    for folder, _, files in os.walk(top):
        for f in sorted(files):
            if f.endswith('.py'):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
                if rel.endswith('.__init__'):
                    rel = rel[:-len('.__init__')]
                yield rel, path


def _defined_names(tree):
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(
                node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _private(name):
    return name.startswith('_') and not (
        name.startswith('__') and name.endswith('__'))


def private_accesses():
    """{file: {private names it uses but does not define}}."""
    found = {}
    for name, path in _modules(DIST):
        tree = ast.parse(open(path).read(), path)
        own = _defined_names(tree) | STDLIB_PRIVATE
        rel = os.path.relpath(path, ROOT)
        for node in ast.walk(tree):
            used = []
            if isinstance(node, ast.Attribute) and _private(node.attr):
                used.append(node.attr)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name)
                used += [a.name for a in node.names if _private(a.name)
                         and not _is_module(base + '.' + a.name)]
            for u in used:
                if u not in own:
                    found.setdefault(rel, set()).add(u)
    return found


def _resolve(node, module):
    if not node.level:
        return node.module or ''
    parts = module.split('.')[:len(module.split('.')) - node.level + 1]
    return '.'.join(parts + ([node.module] if node.module else []))


def _is_module(dotted):
    path = os.path.join(ROOT, *dotted.split('.'))
    return os.path.isfile(path + '.py') or os.path.isdir(path)


def import_graph():
    """{module: modules of minichain it imports (anywhere in the file)}."""
    modules = dict(_modules(PACKAGE))
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(open(path).read(), path)
        deps = set()
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name)
                targets = [base + '.' + a.name for a in node.names] + [base]
            for t in targets:
                # The longest prefix that is a module of ours.
                while t and t not in modules:
                    t = t.rpartition('.')[0]
                if t and t != name and not name.startswith(t + '.') \
                        and t != 'minichain':
                    deps.add(t)
        graph[name] = deps
    return graph


def circles(graph):
    """The strongly connected components with more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return set(out)


def test_no_module_of_dist_uses_another_modules_private_members():
    found = private_accesses()
    new = {f: sorted(n - KNOWN_PRIVATE.get(f, set()))
           for f, n in found.items() if n - KNOWN_PRIVATE.get(f, set())}
    assert not new, 'private members used across modules: {}'.format(new)
    stale = {f: sorted(n - found.get(f, set()))
             for f, n in KNOWN_PRIVATE.items() if n - found.get(f, set())}
    assert not stale, 'KNOWN_PRIVATE lists what is gone: {}'.format(stale)


def test_minichain_has_no_import_circle():
    found = circles(import_graph())
    assert found <= KNOWN_CIRCLES, 'import circles: {}'.format(
        sorted(found - KNOWN_CIRCLES))
    assert KNOWN_CIRCLES <= found, 'KNOWN_CIRCLES lists what is gone: {}'.format(
        sorted(KNOWN_CIRCLES - found))


def test_the_checks_can_fail(tmp_path):
    # The circle finder and the private-name rule on known inputs.
    assert circles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == {
        ('a', 'b', 'c')}
    assert circles({'a': {'b'}, 'b': set()}) == set()
    tree = ast.parse('import os\nclass A:\n    def f(self, o):\n'
                     '        self._x = 1\n        return o._y, os._exit\n')
    own = _defined_names(tree) | STDLIB_PRIVATE
    assert '_x' in own and '_y' not in own and '_exit' in own
