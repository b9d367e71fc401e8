"""minichain's structure as tests: the lesson and its layers.

The lesson is the tape, the op bodies and the dist protocol; the layers
(kernels, dist guards, trace, transports, testing) wrap it from outside.
The rules, on the import graph of every module (imports inside functions
count too: a lazy import hides an arrow from Python, not from the reader):

1. the lesson imports no layer, but for one install line per layer in
   ``minichain/__init__.py`` or ``minichain/dist/__init__.py``, marked
   ``# layer: NAME``;
2. a layer uses the lesson's public names only;
3. a layer imports another layer only where docs/dist.md draws it
   (``ALLOWED``);
4. no import circle, and no module of minichain.dist reaches into another
   dist module's private members;
5. a student's path reads as the protocol: each step within its file's
   first screen.
"""
import ast
import os
import re

import pytest

import minichain

PACKAGE = os.path.dirname(os.path.abspath(minichain.__file__))
ROOT = os.path.dirname(PACKAGE)
LAYERS = {'kernels': 'minichain.kernels', 'guards': 'minichain.dist.guards',
          'trace': 'minichain.dist.trace',
          'transports': 'minichain.dist.transports',
          'testing': 'minichain.dist.testing'}
INSTALLERS = {'kernels': 'minichain', 'guards': 'minichain.dist',
              'trace': 'minichain.dist', 'transports': 'minichain.dist',
              'testing': 'minichain.dist'}
# layer -> the layers it may import (drawn in docs/dist.md, "The layers")
ALLOWED = {}
STDLIB_PRIVATE = {'_exit', '_replace', '_asdict', '_fields', '_make'}


def modules(top=PACKAGE, root=ROOT):
    """{dotted name: path} of the .py files under ``top``."""
    out = {}
    for folder, _, files in os.walk(top):
        for f in files:
            if f.endswith('.py'):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, '.')
                out[name[:-len('.__init__')] if name.endswith('.__init__')
                    else name] = path
    return out


def layer_of(module):
    return next((k for k, v in LAYERS.items()
                 if module == v or module.startswith(v + '.')), None)


def _resolve(node, module, is_package):
    if not node.level:
        return node.module or ''
    parts = module.split('.')
    parts = parts[:len(parts) - node.level + (1 if is_package else 0)]
    return '.'.join(parts + ([node.module] if node.module else []))


def imports(name, path, known):
    """``[(line number, imported module, names)]`` of ``name``'s imports of
    minichain modules (the longest prefix that is a module)."""
    tree = ast.parse(open(path).read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs = [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, name, path.endswith('__init__.py'))
            pairs = [(base + '.' + a.name, ()) for a in node.names
                     if base + '.' + a.name in known]
            pairs.append((base, tuple(a.name for a in node.names)))
        else:
            continue
        for target, names in pairs:
            while target and target not in known:
                target = target.rpartition('.')[0]
            if target and target != name and not name.startswith(target + '.'):
                out.append((node.lineno, target, names))
    return out


def arrows(known=None):
    known = known or modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def install_lines(path):
    """{layer: line number} of the ``# layer: NAME`` lines of a file."""
    with open(path) as f:
        return {m.group(1): i for i, line in enumerate(f, 1)
                for m in [re.search(r'#\s*layer:\s*(\w+)', line)] if m}


def lesson_to_layer(graph, known):
    """The lesson's arrows into a layer that are not its install line."""
    bad = []
    for name, found in graph.items():
        if layer_of(name):
            continue
        marked = install_lines(known[name])
        for line, target, _ in found:
            layer = layer_of(target)
            if layer and not (marked.get(layer) == line
                              and INSTALLERS[layer] == name):
                bad.append('{}:{} -> {}'.format(name, line, target))
    return bad


def test_the_lesson_imports_no_layer_but_by_its_install_line():
    known = modules()
    assert lesson_to_layer(arrows(known), known) == []
    for layer, installer in INSTALLERS.items():
        assert layer in install_lines(known[installer]), (layer, installer)


def test_a_layer_uses_the_lesson_s_public_names_only():
    known, bad = modules(), []
    for name, found in arrows(known).items():
        if not layer_of(name):
            continue
        tree = ast.parse(open(known[name]).read())
        lesson = {a.asname or a.name.split('.')[-1]
                  for node in ast.walk(tree)
                  if isinstance(node, (ast.Import, ast.ImportFrom))
                  for a in node.names}
        for _, target, names in found:
            if not layer_of(target):
                bad += ['{} imports {}'.format(name, '.'.join(
                    [target] + [n for n in names if _private(n)]))
                        for n in ('',) if any(map(_private, target.split(
                            '.') + list(names)))]
        bad += ['{} uses {}.{}'.format(name, n.value.id, n.attr)
                for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name) and n.value.id in lesson
                and _private(n.attr) and not layer_of(_module_named(
                    n.value.id, found))]
    assert bad == []


def _module_named(alias, found):
    return next((t for _, t, _ in found if t.rsplit('.', 1)[-1] == alias),
                'minichain.kernels')  # a layer's own name: not checked


def test_a_layer_imports_another_only_where_the_docs_draw_it():
    bad = sorted('{} -> {}'.format(name, target)
                 for name, found in arrows().items() for _, target, _ in found
                 if layer_of(name) and layer_of(target)
                 and layer_of(target) != layer_of(name)
                 and layer_of(target) not in ALLOWED.get(layer_of(name), ()))
    assert bad == []


def test_the_rules_catch_a_lesson_module_importing_a_layer(tmp_path):
    (tmp_path / 'minichain' / 'kernels').mkdir(parents=True)
    files = {'__init__.py': 'from minichain import kernels  # layer: kernels\n',
             'kernels/__init__.py': '', 'kernels/fast.py': '',
             'op.py': 'def f():\n    from minichain.kernels import fast\n'}
    for rel, text in files.items():
        (tmp_path / 'minichain' / rel).write_text(text)
    known = modules(str(tmp_path / 'minichain'), str(tmp_path))
    assert 'minichain.op:2 -> minichain.kernels.fast' in lesson_to_layer(
        arrows(known), known)


# -- circles and private members --------------------------------------------
def _private(name):
    return name.startswith('_') and not (
        name.startswith('__') and name.endswith('__'))


def circles(graph):
    """The strongly connected components with more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), set()

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
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.add(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_minichain_has_no_import_circle():
    graph = {name: {t for _, t, _ in found if t != 'minichain'}
             for name, found in arrows().items()}
    assert circles(graph) == set()
    assert circles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == {
        ('a', 'b', 'c')}


def test_no_module_of_dist_uses_another_modules_private_members():
    found = {}
    for name, path in modules(os.path.join(PACKAGE, 'dist')).items():
        tree = ast.parse(open(path).read(), path)
        own = STDLIB_PRIVATE | {
            getattr(n, 'name', None) or getattr(n, 'id', None)
            or getattr(n, 'arg', None) or getattr(n, 'attr', None)
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.arg))
            or (isinstance(n, (ast.Name, ast.Attribute))
                and isinstance(n.ctx, (ast.Store, ast.Del)))}
        used = {n.attr for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and _private(n.attr)}
        if used - own:
            found[name] = sorted(used - own)
    assert found == {}


# -- the student's path -------------------------------------------------------
SCREEN = 60  # lines


@pytest.mark.parametrize('path, steps', [
    ('dist/flat.py', ['packer.pack(', 'self.allreduce_packed(',
                      'packer.unpack(', 'self.wire.Allreduce(MPI.IN_PLACE']),
    ('dist/pure_nccl.py', ['def init_nccl_comm(', 'get_unique_id()',
                           'bcast(uid, root=0)', 'NcclCommunicator(']),
    ('dist/communicator_base.py', ['def multi_node_mean_grad(',
                                   'self.plan_grads(', 'self.mean_grads(']),
    ('dist/optimizers.py', ['self.averaging.average(target)',
                            'self.averaging.step(']),
])
def test_each_step_of_the_protocol_is_in_its_file_s_first_screen(path, steps):
    with open(os.path.join(PACKAGE, path)) as f:
        text = ''.join(f.readlines()[:SCREEN])
    where = [text.find(s) for s in steps]
    assert -1 not in where and where == sorted(where), dict(zip(steps, where))


def test_average_then_step_with_nothing_in_between():
    with open(os.path.join(PACKAGE, 'dist', 'optimizers.py')) as f:
        text = f.read()
    average = text.index('self.averaging.average(target)')
    between = text[average:text.index('self.averaging.step(', average)]
    assert between.count('\n') == 1, between  # the next line steps
