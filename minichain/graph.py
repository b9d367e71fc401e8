"""Draw the tape: the graph of Variables and FunctionNodes behind an output.

``build_computational_graph(loss)`` walks from the outputs back through each
variable's ``creator`` and each function's ``inputs`` and returns a
:class:`ComputationalGraph`; ``dump()`` turns it into Graphviz DOT text
(variables as ellipses labelled with name, shape and dtype; functions as
boxes labelled with the FunctionNode's ``label``). ``render`` writes the DOT
file and, when Graphviz's ``dot`` program is installed, a PNG beside it.

A variable the program still holds is drawn as its Variable; one it has
dropped lives on in the graph only as its VariableNode (no data, but its
name, shape and dtype), and is drawn from that.

Build the graph *before* ``backward()``, or run backward with
``retain_graph=True``: backward frees each node's inputs once it has run, and
a freed node is drawn dashed with nothing above it.

Example::

    import minichain.graph
    y = F.sum(F.tanh(x * W))
    g = minichain.graph.build_computational_graph(y)
    minichain.graph.render(g, 'y.dot')   # y.dot, and y.png if dot exists
"""
import os
import shutil
import subprocess
import warnings

from minichain.serializers.npz import atomic_write
from minichain.variable import Variable, VariableNode

__all__ = ['ComputationalGraph', 'build_computational_graph', 'render']

_RANKDIRS = ('TB', 'BT', 'LR', 'RL')
_VARIABLE_STYLE = {'shape': 'ellipse'}
_FUNCTION_STYLE = {'shape': 'box'}


class ComputationalGraph:
    """Variables and functions reachable backward from some outputs.

    Attributes:
        nodes: tuple of the Variables (VariableNodes for those that the
            program dropped) and FunctionNodes, in topological order (every
            node after the nodes it was computed from).
        edges: tuple of ``(src, dst)`` pairs of those objects: ``(x, f)``
            when ``f`` reads ``x`` (twice for ``x * x``), ``(f, y)`` when
            ``f`` created ``y``.
        ids: dict from ``id(node)`` to its DOT id (``'v0'``, ``'f0'``, ...),
            numbered in node order, so equal graphs dump to equal text.

    Built by :func:`build_computational_graph`; it holds references to the
    nodes, so they stay alive as long as the graph does.
    """

    def __init__(self, nodes, edges, variable_style, function_style,
                 rankdir, show_name):
        self.nodes = tuple(nodes)
        self.edges = tuple(edges)
        self.variable_style = variable_style
        self.function_style = function_style
        self.rankdir = rankdir
        self.show_name = show_name
        self.ids = {}
        counts = {'v': 0, 'f': 0}
        for node in self.nodes:
            kind = 'v' if _is_variable(node) else 'f'
            self.ids[id(node)] = '{}{}'.format(kind, counts[kind])
            counts[kind] += 1

    def dump(self, format='dot'):
        """Return the graph as text; only ``format='dot'`` (Graphviz) exists.

        Raises:
            ValueError: for any other format.
        """
        if format != 'dot':
            raise ValueError("ComputationalGraph.dump: unknown format {!r} "
                             "(only 'dot' is supported)".format(format))
        lines = ['digraph graphname {',
                 '  graph [rankdir={}];'.format(self.rankdir)]
        for node in self.nodes:
            lines.append('  {} [{}];'.format(self.ids[id(node)],
                                             _attributes(self._style(node))))
        for src, dst in self.edges:
            lines.append('  {} -> {};'.format(self.ids[id(src)],
                                              self.ids[id(dst)]))
        lines.append('}')
        return '\n'.join(lines) + '\n'

    def _style(self, node):
        if _is_variable(node):
            style = dict(self.variable_style)
            style['label'] = _variable_label(node, self.show_name)
        else:
            style = dict(self.function_style)
            style['label'] = node.label
            if node.inputs is None:
                # Freed by backward: its inputs are gone, so is the picture
                # above it; say so rather than draw a false leaf.
                style.setdefault('style', 'dashed')
        return style

    def __repr__(self):
        return '<ComputationalGraph: {} nodes, {} edges>'.format(
            len(self.nodes), len(self.edges))


def build_computational_graph(outputs, remove_split=True, variable_style=None,
                              function_style=None, rankdir='TB',
                              show_name=True):
    """Collect the graph that computed ``outputs``, for drawing.

    Follows ``creator`` from each output and ``inputs`` from each function
    down to the leaves (variables without a creator). Only what is still
    present is walked: after a backward without ``retain_graph=True`` a
    function's ``inputs`` is None and the walk stops there.

    Args:
        outputs: a Variable or an iterable of Variables.
        remove_split: kept for Chainer compatibility and must be True:
            minichain has no Split nodes (a variable read by two functions
            simply has two out-edges).
        variable_style: dict of extra DOT attributes for variable nodes,
            merged over ``{'shape': 'ellipse'}`` (e.g. ``{'style': 'filled',
            'fillcolor': 'gray90'}``).
        function_style: the same for functions, over ``{'shape': 'box'}``.
        rankdir: 'TB' (top to bottom), 'BT', 'LR' or 'RL'.
        show_name: put each variable's ``name`` (if any) in its label.
    Returns:
        ComputationalGraph.
    Raises:
        TypeError: an output is not a Variable; ValueError: a bad rankdir or
        ``remove_split=False``.
    """
    if remove_split is not True:
        raise ValueError('build_computational_graph: remove_split must be '
                         'True (minichain has no Split nodes)')
    if rankdir not in _RANKDIRS:
        raise ValueError('build_computational_graph: rankdir must be one of '
                         '{}, got {!r}'.format(_RANKDIRS, rankdir))
    outputs = [outputs] if isinstance(outputs, Variable) else list(outputs)
    for i, y in enumerate(outputs):
        if not isinstance(y, Variable):
            raise TypeError('build_computational_graph: output {} is a {}, '
                            'not a Variable'.format(i, type(y).__name__))
    nodes, edges = _walk(outputs)
    return ComputationalGraph(
        nodes, edges, _merge('variable_style', _VARIABLE_STYLE,
                             variable_style),
        _merge('function_style', _FUNCTION_STYLE, function_style),
        rankdir, show_name)


def _walk(outputs):
    """Post-order depth-first walk: each node after its predecessors.

    Iterative, because a long chain (an unrolled RNN) would overflow
    Python's recursion limit.
    """
    nodes, edges, done = [], [], set()
    for root in outputs:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in done:
                continue
            preds = _predecessors(node)
            if expanded or not preds:
                done.add(id(node))
                nodes.append(node)
                edges.extend((p, node) for p in preds)
                continue
            stack.append((node, True))
            # Reversed, so that the first input is visited (numbered) first.
            stack.extend((p, False) for p in reversed(preds)
                         if id(p) not in done)
    return nodes, edges


def _is_variable(node):
    return isinstance(node, (Variable, VariableNode))


def _predecessors(node):
    if _is_variable(node):
        return [] if node.creator is None else [node.creator]
    return [] if node.inputs is None else [_shown(x) for x in node.inputs]


def _shown(node):
    """What stands for a function's input in the picture: the Variable while
    the program holds it (the object the user knows), else its node. Each
    is one object for the whole walk, so ``id`` finds it again."""
    var = node.get_variable_or_none()
    return node if var is None else var


def _merge(arg, default, extra):
    if extra is None:
        return dict(default)
    if not isinstance(extra, dict):
        raise TypeError('build_computational_graph: {} must be a dict of DOT '
                        'attributes or None, got {}'.format(
                            arg, type(extra).__name__))
    return {**default, **extra}


def _variable_label(v, show_name):
    if isinstance(v, Variable) and v.array is None:
        desc = 'uninitialized'
    else:
        desc = '{}, {}'.format(tuple(v.shape), v.dtype)
    if show_name and v.name:
        return '{}\n{}'.format(v.name, desc)
    return desc


def _quote(value):
    text = str(value).replace('\\', '\\\\').replace('"', '\\"')
    return '"{}"'.format(text.replace('\n', '\\n'))


def _attributes(style):
    """``label`` first, then the other attributes sorted: stable text."""
    keys = ['label'] + sorted(k for k in style if k != 'label')
    return ','.join('{}={}'.format(k, _quote(style[k])) for k in keys)


def render(graph, path, timeout=60):
    """Write ``graph`` as DOT text to ``path`` and, if possible, a PNG beside.

    Both files are written atomically (a temporary file, then a rename), so
    a reader never sees half a file. The PNG (``path`` with its extension
    replaced by ``.png``) is made by Graphviz's ``dot`` program when it is
    on PATH; without it a warning says so and only the DOT file is written.

    Args:
        graph: a ComputationalGraph, or outputs to build one from.
        path: where the DOT text goes (e.g. ``'graph.dot'``).
        timeout: seconds to let ``dot`` run.
    Returns:
        list of the paths written: ``[path]`` or ``[path, png_path]``.
    Raises:
        ValueError: ``path`` ends in ``.png`` (the PNG would overwrite it).
        RuntimeError: ``dot`` failed or ran longer than ``timeout``.
    """
    if not isinstance(graph, ComputationalGraph):
        graph = build_computational_graph(graph)
    path = os.fspath(path)
    png = os.path.splitext(path)[0] + '.png'
    if png == path:
        raise ValueError('render: path {!r} ends in .png; give the DOT file '
                         'path (e.g. graph.dot)'.format(path))
    with atomic_write(path) as f:
        f.write(graph.dump().encode('utf-8'))
    dot = shutil.which('dot')
    if dot is None:
        warnings.warn('render: Graphviz `dot` is not on PATH, so only {} was '
                      'written (install Graphviz, then run: dot -Tpng {} -o '
                      '{})'.format(path, path, png), RuntimeWarning,
                      stacklevel=2)
        return [path]
    try:
        proc = subprocess.run([dot, '-Tpng', path], capture_output=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError('render: dot ran longer than {} s on {}'
                           .format(timeout, path)) from None
    if proc.returncode != 0:
        raise RuntimeError('render: dot failed on {} (exit {}): {}'.format(
            path, proc.returncode,
            proc.stderr.decode('utf-8', 'replace').strip()))
    with atomic_write(png) as f:
        f.write(proc.stdout)
    return [path, png]
