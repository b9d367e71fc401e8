"""The peel check: the lesson runs with its layers deleted.

    python tests/peel.py               # every layer deleted: the lesson's tests
    python tests/peel.py guards trace  # only these deleted
    python tests/peel.py --each        # each layer alone deleted

Copies ``minichain/`` into a temporary folder, deletes each named layer's
folder and its install line (the line marked ``# layer: NAME`` in
``minichain/__init__.py`` or ``minichain/dist/__init__.py``), then, with
the copy first on ``PYTHONPATH``:

1. imports every module left (a lesson module that imports a deleted layer
   fails here, naming it);
2. runs the lesson's tests (``LESSON``; a listed test file that imports a
   deleted layer is left out and named), the MPI ones under mpiexec;

``--each``: for each layer alone, steps 1 and the data-parallel test
(``tests/dist/test_bare.py``: a two- and three-rank flat step averages).
Exits non-zero on the first failure. ``make test-peeled`` runs both.
"""
import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = {'kernels': 'minichain/kernels', 'guards': 'minichain/dist/guards',
          'trace': 'minichain/dist/trace',
          'transports': 'minichain/dist/transports',
          'testing': 'minichain/dist/testing'}
INSTALLERS = ('minichain/__init__.py', 'minichain/dist/__init__.py')
# The lesson's tests: the tape, every op's body and its gradient check, the
# links and optimizers, ResNet-50's forward/backward, every averaging mode
# against one process, and the reading order's executed docs pages.
LESSON = ['tests/test_variable.py', 'tests/test_function_node.py',
          'tests/test_gradient_check.py', 'tests/test_link.py',
          'tests/test_sequential.py', 'tests/test_optimizer.py',
          'tests/test_initializers.py', 'tests/test_grad_ready.py',
          'tests/test_serializers.py', 'tests/functions', 'tests/links',
          'tests/optimizers', 'tests/models/test_resnet.py',
          'tests/dist/test_bare.py', 'tests/test_docs.py::test_page[tape.md]',
          'tests/test_docs.py::test_page[new_function.md]',
          'tests/test_docs.py::test_page[data_parallel.md]',
          'tests/test_docs.py::test_page[overlap.md]',
          'tests/test_docs.py::test_page[ring_and_zero.md]']
PLUGIN = 'minichain.dist.testing.pytest_plugin'


def peel(dest, layers):
    """A copy of the package in ``dest`` without ``layers``."""
    shutil.copytree(os.path.join(ROOT, 'minichain'),
                    os.path.join(dest, 'minichain'),
                    ignore=shutil.ignore_patterns('__pycache__'))
    for layer in layers:
        shutil.rmtree(os.path.join(dest, LAYERS[layer]))
    for rel in INSTALLERS:
        path = os.path.join(dest, rel)
        with open(path) as f:
            lines = f.readlines()
        kept = [line for line in lines if not any(
            re.search(r'#\s*layer:\s*{}\b'.format(n), line) for n in layers)]
        with open(path, 'w') as f:
            f.writelines(kept)
    return dest


def run(cmd, env, what):
    print('peel: ' + what, flush=True)
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode:
        sys.exit('peel: FAILED: ' + what)


IMPORT_ALL = '''
import importlib, os, sys
import minichain
root = os.path.dirname(minichain.__file__)
assert root.startswith({dest!r}), root  # the copy, not the checkout
for folder, _, files in os.walk(root):
    for f in sorted(files):
        if f.endswith('.py') and f != '__main__.py':
            name = os.path.relpath(os.path.join(folder, f[:-3]),
                                   os.path.dirname(root)).replace(os.sep, '.')
            importlib.import_module(name.removesuffix('.__init__'))
'''


def imports_a_deleted_layer(path, layers):
    """Whether the test file at ``path`` imports a deleted layer's module."""
    gone = tuple(LAYERS[n].replace('/', '.') for n in layers)
    tree = ast.parse(open(path).read(), path)
    # at module level: a test that imports a layer inside a function skips
    # itself where the layer is gone (pytest.importorskip)
    nodes = tree.body
    names = [a.name for n in nodes if isinstance(n, ast.Import)
             for a in n.names]
    names += [(n.module or '') + '.' + a.name for n in nodes
              if isinstance(n, ast.ImportFrom) for a in n.names]
    return any(m == g or m.startswith(g + '.') for m in names for g in gone)


def lesson_tests(layers):
    """LESSON, less (and naming) the test files that import a deleted
    layer: they are that layer's tests."""
    selected, left = [], []
    for item in LESSON:
        path = os.path.join(ROOT, item.split('::')[0])
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(path, f) for f in os.listdir(path)
            if f.startswith('test_') and f.endswith('.py'))
        for f in files:
            rel = os.path.relpath(f, ROOT)
            if imports_a_deleted_layer(f, layers):
                left += [rel] if rel not in left else []
            else:
                selected.append(item if f == path else rel)
    return selected, left


def check(layers, tests, dest):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [dest] + [p for p in [os.environ.get('PYTHONPATH')] if p]),
        MINICHAIN_REQUIRE_MPI='1', PYTHONSAFEPATH='1')  # not the checkout
    name = ', '.join(layers) or 'no layer'
    run([sys.executable, '-c', IMPORT_ALL.format(dest=dest)], env,
        'every module imports without ' + name)
    selected, left = lesson_tests(layers)
    if tests != 'all':
        selected, left = [t for t in selected if t in tests], []
    if left:
        print('peel: left out, they test a deleted layer: ' + ', '.join(left))
    # append: the checkout goes after the copy on sys.path
    run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:' + PLUGIN,
         '-p', 'no:cacheprovider', '--import-mode=append'] + selected, env,
        'the lesson\'s tests without ' + name)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('layers', nargs='*', choices=[[]] + sorted(LAYERS),
                        help='the layers to delete (default: every one)')
    parser.add_argument('--each', action='store_true',
                        help='each layer alone deleted: imports and the '
                             'data-parallel step')
    args = parser.parse_args(argv)
    if args.each:
        for layer in sorted(LAYERS):
            with tempfile.TemporaryDirectory(prefix='peel-') as dest:
                check([layer], ['tests/dist/test_bare.py'],
                      peel(dest, [layer]))
        return
    layers = args.layers or sorted(LAYERS)
    with tempfile.TemporaryDirectory(prefix='peel-') as dest:
        check(layers, 'all', peel(dest, layers))


if __name__ == '__main__':
    main()
