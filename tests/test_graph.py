"""minichain.graph: the DOT text of a computational graph, and render()."""
import os
import shutil
import stat

import numpy
import pytest

import minichain
import minichain.functions as F
import minichain.graph
from minichain import FunctionNode, Variable
from minichain.graph import build_computational_graph, render
from minichain.variable import VariableNode


def var(shape, name=None, dtype=numpy.float32):
    return Variable(numpy.arange(numpy.prod(shape), dtype=dtype)
                    .reshape(shape) / 10 + 0.1, name=name)


def small_graph():
    """x (2, 3) @ W (3, 4) -> tanh -> sum: the example of the tests."""
    x, W = var((2, 3), 'x'), var((3, 4), 'W')
    y = F.sum(F.tanh(x @ W))
    y.name = 'loss'
    return x, W, y


EXPECTED = '''digraph graphname {
  graph [rankdir=TB];
  v0 [label="x\\n(2, 3), float32",shape="ellipse"];
  v1 [label="W\\n(3, 4), float32",shape="ellipse"];
  f0 [label="MatMul",shape="box"];
  v2 [label="(2, 4), float32",shape="ellipse"];
  f1 [label="Tanh",shape="box"];
  v3 [label="(2, 4), float32",shape="ellipse"];
  f2 [label="Sum",shape="box"];
  v4 [label="loss\\n(), float32",shape="ellipse"];
  v0 -> f0;
  v1 -> f0;
  f0 -> v2;
  v2 -> f1;
  f1 -> v3;
  v3 -> f2;
  f2 -> v4;
}
'''


def test_module_is_importable_by_dotted_name():
    assert minichain.graph.build_computational_graph is \
        build_computational_graph


def test_dump_exact_text():
    _, _, y = small_graph()
    assert build_computational_graph(y).dump() == EXPECTED


def test_nodes_and_edges_are_the_real_objects_in_topological_order():
    x, W, y = small_graph()
    g = build_computational_graph([y])
    assert g.nodes[0] is x and g.nodes[1] is W and g.nodes[-1] is y
    assert g.nodes[2] is y.creator.inputs[0].creator.inputs[0].creator
    kinds = ['f' if isinstance(n, FunctionNode) else 'v' for n in g.nodes]
    assert kinds == list('vvfvfvfv')
    # The intermediates were dropped by small_graph: only their graph nodes
    # (no data) are left to draw.
    assert all(isinstance(g.nodes[i], VariableNode) for i in (3, 5))
    assert g.nodes[3] is y.creator.inputs[0].creator.inputs[0]
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    assert len(g.edges) == 7
    for src, dst in g.edges:
        assert pos[id(src)] < pos[id(dst)]
        assert isinstance(src, FunctionNode) != isinstance(dst, FunctionNode)
    assert g.ids[id(x)] == 'v0' and g.ids[id(y.creator)] == 'f2'


def test_text_is_deterministic_across_builds_and_equal_graphs():
    _, _, y1 = small_graph()
    _, _, y2 = small_graph()
    texts = {build_computational_graph(y).dump() for y in (y1, y1, y2)}
    assert len(texts) == 1


def test_shared_variable_appears_once_with_one_edge_per_use():
    x = var((3,), 'x')
    a = F.exp(x)
    y = a * a + F.tanh(a)     # a is read by Mul (twice) and by Tanh
    g = build_computational_graph(y)
    assert sum(n is a for n in g.nodes) == 1
    out_of_a = [dst.label for src, dst in g.edges if src is a]
    assert sorted(out_of_a) == ['Mul', 'Mul', 'Tanh']
    assert [n.label for n in g.nodes if isinstance(n, FunctionNode)] == \
        ['Exp', 'Mul', 'Tanh', 'Add']


def test_several_outputs_and_duplicates():
    x = var((2,), 'x')
    y, z = F.exp(x), F.tanh(x)
    g = build_computational_graph((y, z, y))
    assert len(g.nodes) == 5 and sum(n is x for n in g.nodes) == 1
    assert g.nodes[-1] is z


def test_labels_without_names_and_with_quotes():
    x = var((2,), 'say "hi"\\')
    g = build_computational_graph(F.exp(x), show_name=False)
    assert 'say' not in g.dump()
    text = build_computational_graph(F.exp(x)).dump()
    assert 'label="say \\"hi\\"\\\\\\n(2,), float32"' in text


def test_styles_merge_and_rankdir():
    _, _, y = small_graph()
    text = build_computational_graph(
        y, variable_style={'style': 'filled', 'fillcolor': 'gray90'},
        function_style={'shape': 'record'}, rankdir='LR').dump()
    assert 'graph [rankdir=LR];' in text
    assert ('v0 [label="x\\n(2, 3), float32",fillcolor="gray90",'
            'shape="ellipse",style="filled"];') in text
    assert 'f0 [label="MatMul",shape="record"];' in text


def test_freed_graph_shows_only_what_remains():
    _, _, y = small_graph()
    y.backward()
    text = build_computational_graph(y).dump()
    assert text == ('digraph graphname {\n  graph [rankdir=TB];\n'
                    '  f0 [label="Sum",shape="box",style="dashed"];\n'
                    '  v0 [label="loss\\n(), float32",shape="ellipse"];\n'
                    '  f0 -> v0;\n}\n')


def test_retain_graph_keeps_the_whole_picture():
    _, _, y = small_graph()
    y.backward(retain_graph=True)
    assert build_computational_graph(y).dump() == EXPECTED


def test_gradient_graph_after_double_backprop():
    x = var((3,), 'x', numpy.float64)
    F.sum(x * x * x).backward(enable_double_backprop=True)
    g = build_computational_graph(x.grad_var)
    assert g.nodes[-1] is x.grad_var
    assert any(n is x for n in g.nodes)
    assert len(g.nodes) > 3


def test_leaf_only_and_no_backprop_graph():
    x = var((2,), 'x')
    assert len(build_computational_graph(x).nodes) == 1
    with minichain.no_backprop_mode():
        y = F.exp(x)
    assert build_computational_graph(y).nodes == (y,)


def test_long_chain_does_not_recurse():
    h = var((1,))
    for _ in range(3000):
        h = h * 1.0
    g = build_computational_graph(h)
    assert len(g.nodes) == 2 * 3000 + 1 + 3000  # x, each Mul, its constant, y


def test_bad_arguments():
    _, _, y = small_graph()
    with pytest.raises(TypeError, match='build_computational_graph: output 1 '
                       'is a ndarray'):
        build_computational_graph([y, y.array])
    with pytest.raises(ValueError, match='rankdir'):
        build_computational_graph(y, rankdir='up')
    with pytest.raises(ValueError, match='remove_split'):
        build_computational_graph(y, remove_split=False)
    with pytest.raises(TypeError, match='variable_style must be a dict'):
        build_computational_graph(y, variable_style='filled')
    with pytest.raises(ValueError, match="unknown format 'png'"):
        build_computational_graph(y).dump('png')


# -- render -------------------------------------------------------------------
def fake_dot(tmp_path, body):
    path = tmp_path / 'bin' / 'dot'
    path.parent.mkdir()
    path.write_text('#!/bin/sh\n' + body + '\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_render_without_dot_writes_only_the_dot_file(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, 'which', lambda name: None)
    _, _, y = small_graph()
    path = str(tmp_path / 'y.dot')
    with pytest.warns(RuntimeWarning, match='`dot` is not on PATH'):
        written = render(y, path)
    assert written == [path]
    assert open(path).read() == EXPECTED
    assert os.listdir(tmp_path) == ['y.dot']  # no temporary file left


def test_render_runs_dot_and_writes_png(tmp_path, monkeypatch):
    dot = fake_dot(tmp_path, 'echo PNGDATA; cat "$2" > /dev/null')
    monkeypatch.setattr(shutil, 'which', lambda name: dot)
    _, _, y = small_graph()
    written = render(build_computational_graph(y), tmp_path / 'g.dot')
    assert written == [str(tmp_path / 'g.dot'), str(tmp_path / 'g.png')]
    assert (tmp_path / 'g.png').read_bytes() == b'PNGDATA\n'
    assert sorted(os.listdir(tmp_path)) == ['bin', 'g.dot', 'g.png']


def test_render_reports_dot_failure_and_timeout(tmp_path, monkeypatch):
    _, _, y = small_graph()
    dot = fake_dot(tmp_path, 'echo "syntax error" >&2; exit 3')
    monkeypatch.setattr(shutil, 'which', lambda name: dot)
    with pytest.raises(RuntimeError, match='exit 3.*syntax error'):
        render(y, tmp_path / 'g.dot')
    assert not (tmp_path / 'g.png').exists()
    os.remove(dot)
    os.rmdir(os.path.dirname(dot))
    dot = fake_dot(tmp_path, 'exec sleep 5')
    with pytest.raises(RuntimeError, match='longer than 0.2 s'):
        render(y, tmp_path / 'g.dot', timeout=0.2)
    with pytest.raises(ValueError, match='ends in .png'):
        render(y, tmp_path / 'g.png')


@pytest.mark.skipif(shutil.which('dot') is None,
                    reason='Graphviz `dot` is not installed')
def test_render_with_real_graphviz(tmp_path):
    _, _, y = small_graph()
    written = render(y, tmp_path / 'g.dot')
    assert len(written) == 2
    assert (tmp_path / 'g.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
