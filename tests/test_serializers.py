"""save_npz / load_npz: round trips, bit-identical resume, atomicity, errors."""
import io
import os

import numpy
import pytest

import minichain
from minichain import (backend, functions as F, links as L, optimizer_hooks,
                       optimizers, serializers)


class Stats(minichain.Link):
    """A link with one parameter and persistents of every storable kind."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.gamma = minichain.Parameter(numpy.ones(3, numpy.float32))
        self.add_persistent('avg', numpy.zeros(3, numpy.float32))
        self.add_persistent('count', 0)
        self.add_persistent('scale', 1.0)
        self.add_persistent('flag', False)
        self.add_persistent('label', 'none')
        self.add_persistent('half', numpy.float32(0.5))


class Net(minichain.Chain):
    def __init__(self, in_size=4):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(in_size, 6)
            self.l2 = L.Linear(6, 3)
            self.stats = Stats()

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def _set_stats(stats):
    stats.gamma.array[...] = [1, 2, 3]
    stats.avg[...] = [0.25, 0.5, 0.75]
    stats.count, stats.scale, stats.flag = 7, 2.5, True
    stats.label, stats.half = 'bn', numpy.float32(0.125)


def test_round_trip_of_params_and_persistents(tmp_path):
    src, dst = Net(), Net()
    _set_stats(src.stats)
    path = tmp_path / 'model.npz'
    serializers.save_npz(path, src)
    avg_before = dst.stats.avg
    serializers.load_npz(path, dst)
    for (name, p), (_, q) in zip(src.namedparams(), dst.namedparams()):
        numpy.testing.assert_array_equal(p.array, q.array, err_msg=name)
    s = dst.stats
    assert s.avg is avg_before  # arrays are filled in place
    numpy.testing.assert_array_equal(s.avg, [0.25, 0.5, 0.75])
    assert (s.count, s.scale, s.flag, s.label) == (7, 2.5, True, 'bn')
    assert [type(v) for v in (s.count, s.scale, s.flag, s.label)] == [
        int, float, bool, str]
    assert type(s.half) is numpy.float32 and s.half == 0.125


def test_batch_normalization_statistics_round_trip(tmp_path):
    x = numpy.random.default_rng(0).standard_normal((6, 3)).astype(
        numpy.float32)
    src = minichain.Sequential(L.Linear(3, 4), L.BatchNormalization(4))
    opt = optimizers.SGD(lr=0.1).setup(src)
    for _ in range(2):
        opt.update(lambda: F.sum(src(x) ** 2))
    serializers.save_npz(tmp_path / 'bn.npz', src)
    dst = minichain.Sequential(L.Linear(3, 4), L.BatchNormalization(4))
    serializers.load_npz(tmp_path / 'bn.npz', dst)
    for (path, a), (_, b) in zip(src.namedpersistents(),
                                 dst.namedpersistents()):
        numpy.testing.assert_array_equal(a, b, err_msg=path)
    with minichain.using_config('train', False):
        numpy.testing.assert_array_equal(src(x).array, dst(x).array)


def test_dictionary_serializer_layout_and_snapshot_semantics():
    net = Net()
    ser = serializers.DictionarySerializer()
    ser.save(net)
    assert sorted(ser.target) == [
        'l1/W', 'l1/b', 'l2/W', 'l2/b', 'stats/avg', 'stats/count',
        'stats/flag', 'stats/gamma', 'stats/half', 'stats/label',
        'stats/scale']
    assert ser.target['stats/count'].shape == ()
    w = ser.target['l1/W']
    assert w is not net.l1.W.array and numpy.array_equal(w, net.l1.W.array)
    net.l1.W.array[...] = 0  # the dict is a snapshot
    assert not numpy.array_equal(w, net.l1.W.array)
    with pytest.raises(ValueError, match="'l1/W' is written twice"):
        ser['l1']('W', numpy.zeros(2))


def test_lazy_parameter_is_initialized_from_the_file(tmp_path):
    src, dst = L.Linear(4, 3), L.Linear(None, 3)
    serializers.save_npz(tmp_path / 'm.npz', src)
    serializers.load_npz(tmp_path / 'm.npz', dst)
    assert dst.W.shape == (3, 4)
    numpy.testing.assert_array_equal(dst.W.array, src.W.array)


def test_uninitialized_parameter_saves_nothing_and_loads_as_none(tmp_path):
    serializers.save_npz(tmp_path / 'm.npz', L.Linear(None, 3))
    with numpy.load(tmp_path / 'm.npz') as f:
        assert sorted(f.files) == ['b']
    dst = L.Linear(None, 3)
    serializers.load_npz(tmp_path / 'm.npz', dst)
    assert not dst.W.is_initialized


def _batch(step):
    rng = numpy.random.default_rng(step)
    return (rng.standard_normal((5, 4)).astype(numpy.float32),
            rng.standard_normal((5, 3)).astype(numpy.float32))


def _train(model, opt, steps):
    for step in steps:
        x, y = _batch(step)
        opt.update(lambda: F.mean_squared_error(model(x), y))


OPTIMIZERS = {
    'sgd': lambda: optimizers.SGD(lr=0.05),
    'momentum': lambda: optimizers.MomentumSGD(lr=0.05),
    'adam': lambda: optimizers.Adam(alpha=0.01, weight_decay_rate=1e-3),
    'rmsprop': lambda: optimizers.RMSprop(lr=0.01),
}


def _with_hooks(opt):
    opt.add_hook(optimizer_hooks.WeightDecay(1e-2))
    opt.add_hook(optimizer_hooks.GradientClipping(0.5))
    return opt


@pytest.mark.parametrize('hooks', [False, True])
@pytest.mark.parametrize('name', sorted(OPTIMIZERS))
def test_training_resumes_bit_identically(tmp_path, name, hooks):
    wrap = _with_hooks if hooks else (lambda o: o)
    model = Net()
    opt = wrap(OPTIMIZERS[name]()).setup(model)
    _train(model, opt, range(3))
    opt.new_epoch()
    serializers.save_npz(tmp_path / 'model.npz', model)
    serializers.save_npz(tmp_path / 'opt.npz', opt)
    _train(model, opt, range(3, 6))

    model2 = Net()  # different random initial values
    opt2 = wrap(OPTIMIZERS[name]()).setup(model2)
    serializers.load_npz(tmp_path / 'model.npz', model2)
    serializers.load_npz(tmp_path / 'opt.npz', opt2)
    assert (opt2.t, opt2.epoch) == (3, 1)
    _train(model2, opt2, range(3, 6))

    assert (opt2.t, opt2.epoch) == (opt.t, opt.epoch) == (6, 1)
    for (path, p), (_, q) in zip(model.namedparams(), model2.namedparams()):
        assert numpy.array_equal(p.array, q.array), path
        r, r2 = p.update_rule, q.update_rule
        assert r.t == r2.t == (0 if path == '/stats/gamma' else 6)
        if r.t == 0:
            assert r.state is None and r2.state is None
            continue
        assert sorted(r.state) == sorted(r2.state)
        for key in r.state:
            assert numpy.array_equal(r.state[key], r2.state[key]), (path, key)


def test_resume_without_optimizer_state_differs(tmp_path):
    # negative control: the comparison above can fail
    model = Net()
    opt = optimizers.MomentumSGD(lr=0.05).setup(model)
    _train(model, opt, range(3))
    serializers.save_npz(tmp_path / 'model.npz', model)
    _train(model, opt, range(3, 5))
    model2 = Net()
    opt2 = optimizers.MomentumSGD(lr=0.05).setup(model2)
    serializers.load_npz(tmp_path / 'model.npz', model2)
    _train(model2, opt2, range(3, 5))
    assert not numpy.array_equal(model.l1.W.array, model2.l1.W.array)


def test_optimizer_keys():
    model = Net()
    opt = optimizers.Adam().setup(model)
    ser = serializers.DictionarySerializer()
    ser.save(opt)
    # nothing updated yet: each rule stores only its count
    assert 'l1/W/t' in ser.target and 'l1/W/m' not in ser.target
    _train(model, opt, range(1))
    ser = serializers.DictionarySerializer()
    ser.save(opt)
    assert {'t', 'epoch', 'l1/W/t', 'l1/W/m', 'l1/W/v',
            'stats/gamma/t'} <= set(ser.target)
    assert 'stats/gamma/m' not in ser.target  # gamma is unused: no grad
    assert ser.target['t'][()] == 1


class Snapshot:
    """A trainer-like object: model, optimizer and a counter under keys."""

    def __init__(self, model, opt):
        self.model, self.opt, self.iteration = model, opt, 0

    def serialize(self, s):
        self.model.serialize(s['model'])
        self.opt.serialize(s['optimizer'])
        self.iteration = s('iteration', self.iteration)


def test_nested_object_and_path_prefix(tmp_path):
    model = Net()
    opt = optimizers.MomentumSGD().setup(model)
    _train(model, opt, range(2))
    snap = Snapshot(model, opt)
    snap.iteration = 2
    serializers.save_npz(tmp_path / 'snap.npz', snap)

    model2 = Net()
    snap2 = Snapshot(model2, optimizers.MomentumSGD().setup(model2))
    serializers.load_npz(tmp_path / 'snap.npz', snap2)
    assert snap2.iteration == 2 and snap2.opt.t == 2
    numpy.testing.assert_array_equal(
        snap2.opt.target.l2.b.update_rule.state['v'],
        model.l2.b.update_rule.state['v'])

    only_model = Net()
    serializers.load_npz(tmp_path / 'snap.npz', only_model, path='model/')
    numpy.testing.assert_array_equal(only_model.l1.W.array, model.l1.W.array)


def _files(directory):
    return sorted(os.listdir(directory))


class Exploding:
    """Writes a few entries, then fails mid-way through serialize."""

    def __init__(self, exc):
        self.exc = exc

    def serialize(self, s):
        s('a', numpy.arange(3))
        raise self.exc


@pytest.mark.parametrize('exc', [RuntimeError('boom'), KeyboardInterrupt()])
def test_failing_serialize_leaves_previous_file(tmp_path, exc):
    path = tmp_path / 'model.npz'
    serializers.save_npz(path, L.Linear(2, 2))
    before = path.read_bytes()
    with pytest.raises(type(exc)):
        serializers.save_npz(path, Exploding(exc))
    assert path.read_bytes() == before
    assert _files(tmp_path) == ['model.npz']


def test_interrupted_write_leaves_previous_file(tmp_path, monkeypatch):
    path = tmp_path / 'model.npz'
    serializers.save_npz(path, L.Linear(2, 2))
    before = path.read_bytes()

    def half_write(f, **arrays):
        f.write(b'PK\x03\x04 truncated')
        raise KeyboardInterrupt

    monkeypatch.setattr(numpy, 'savez_compressed', half_write)
    with pytest.raises(KeyboardInterrupt):
        serializers.save_npz(path, L.Linear(2, 2))
    assert path.read_bytes() == before
    assert _files(tmp_path) == ['model.npz']


def test_new_file_gets_umask_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / 'fresh.npz'
    serializers.save_npz(path, L.Linear(2, 2), compression=False)
    assert (os.stat(path).st_mode & 0o777) == (0o666 & ~umask)
    assert _files(tmp_path) == ['fresh.npz']


def test_missing_key_names_key_and_file(tmp_path):
    path = tmp_path / 'small.npz'
    serializers.save_npz(path, L.Linear(2, 3, nobias=True))
    with pytest.raises(KeyError, match=r"'b' is not in .*small\.npz"):
        serializers.load_npz(path, L.Linear(2, 3))


def test_extra_keys_are_listed(tmp_path):
    path = tmp_path / 'big.npz'
    serializers.save_npz(path, Net())
    target = Net()
    del target.stats  # the file has stats/*, the target does not read them
    with pytest.raises(ValueError, match=r"big\.npz has keys that Net did "
                       r"not read: 'stats/avg', 'stats/count'"):
        serializers.load_npz(path, target)


def test_strict_false_ignores_missing_and_extra_keys(tmp_path):
    path = tmp_path / 'part.npz'
    serializers.save_npz(path, L.Linear(2, 3, nobias=True))
    target = L.Linear(2, 3)
    b = target.b.array.copy()
    serializers.load_npz(path, target, strict=False)
    numpy.testing.assert_array_equal(target.b.array, b)
    serializers.load_npz(tmp_path / 'part.npz', L.Linear(2, 3, nobias=True),
                         strict=False)


def test_shape_mismatch_names_key_and_both_shapes(tmp_path):
    path = tmp_path / 'm.npz'
    serializers.save_npz(path, L.Linear(4, 3))
    with pytest.raises(ValueError, match=r"'W' in .*m\.npz has shape "
                       r"\(3, 4\), but the target has shape \(3, 5\)"):
        serializers.load_npz(path, L.Linear(5, 3))


def test_incompatible_dtype_and_scalar_shape(tmp_path):
    stats = Stats()
    stats.avg = numpy.zeros(3, numpy.int32)
    path = tmp_path / 's.npz'
    serializers.save_npz(path, Stats())
    with pytest.raises(ValueError, match="'avg'.*float32.*int32"):
        serializers.load_npz(path, stats)
    deser = serializers.NpzDeserializer({'x': numpy.zeros(2)}, file_name='d')
    with pytest.raises(ValueError, match=r"'x' in d holds an array of shape "
                       r"\(2,\), but the target is a scalar"):
        deser('x', 1.0)


def test_load_refuses_pickled_objects(tmp_path):
    path = tmp_path / 'evil.npz'
    numpy.savez(path, W=numpy.array([{'x': 1}], dtype=object))
    target = minichain.Link()
    target.add_persistent('W', None)
    with pytest.raises(ValueError, match='allow_pickle'):
        serializers.load_npz(path, target)


def test_save_refuses_unstorable_values():
    with pytest.raises(TypeError, match="'x' has a value of type list"):
        serializers.DictionarySerializer()('x', [1, 2])
    with pytest.raises(TypeError, match="'y' has dtype object"):
        serializers.DictionarySerializer()('y', numpy.array([None]))


def test_file_objects_and_npy_files(tmp_path):
    buf = io.BytesIO()
    src, dst = L.Linear(2, 2), L.Linear(2, 2)
    serializers.save_npz(buf, src)
    buf.seek(0)
    serializers.load_npz(buf, dst)
    numpy.testing.assert_array_equal(dst.W.array, src.W.array)
    numpy.save(tmp_path / 'a.npy', numpy.zeros(2))
    with pytest.raises(ValueError, match='not an npz archive'):
        serializers.load_npz(tmp_path / 'a.npy', dst)


def test_atomic_write_text(tmp_path):
    path = tmp_path / 'log'
    with serializers.atomic_write(path, 'w') as f:
        f.write('[1]')
    assert path.read_text() == '[1]'
    with pytest.raises(RuntimeError):
        with serializers.atomic_write(path, 'w') as f:
            f.write('[1, 2')
            raise RuntimeError
    assert path.read_text() == '[1]' and _files(tmp_path) == ['log']


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_gpu_round_trip_and_resume(tmp_path):
    model = Net().to_gpu()
    opt = optimizers.Adam().setup(model)
    x, y = (backend.to_gpu(a) for a in _batch(0))
    opt.update(lambda: F.mean_squared_error(model(x), y))
    serializers.save_npz(tmp_path / 'm.npz', model)
    serializers.save_npz(tmp_path / 'o.npz', opt)
    model2 = Net().to_gpu()
    opt2 = optimizers.Adam().setup(model2)
    serializers.load_npz(tmp_path / 'm.npz', model2)
    serializers.load_npz(tmp_path / 'o.npz', opt2)
    for o, m in ((opt, model), (opt2, model2)):
        o.update(lambda: F.mean_squared_error(m(x), y))
    for (_, p), (_, q) in zip(model.namedparams(), model2.namedparams()):
        assert backend.get_device_id(q.array) == 0
        numpy.testing.assert_array_equal(backend.to_cpu(p.array),
                                         backend.to_cpu(q.array))


def test_npz_deserializer_children_and_skip():
    stored = {'ext/a/x': numpy.zeros(1), 'ext/a/y/z': numpy.zeros(1),
              'ext/b/x': numpy.zeros(1), 'ext/leaf': numpy.zeros(1),
              'other': numpy.zeros(1)}
    s = serializers.NpzDeserializer(stored)
    assert s['ext'].children() == ['a', 'b']
    assert s['ext']['a'].children() == ['y']
    assert s['none'].children() == []
    s['ext']['a'].skip()
    assert s.unused_keys() == ['ext/b/x', 'ext/leaf', 'other']
    assert serializers.Deserializer().children() == []


def test_save_npz_into_a_missing_folder_names_the_file(tmp_path):
    # It named the hidden temporary, '.x.npz.<pid>.<hex>.tmp'.
    path = tmp_path / 'nope' / 'x.npz'
    with pytest.raises(FileNotFoundError) as e:
        serializers.save_npz(str(path), L.Linear(2, 3))
    assert e.value.filename == str(path) and '.tmp' not in str(e.value)
    assert str(e.value) == "[Errno 2] No such file or directory: '{}'".format(
        path)
