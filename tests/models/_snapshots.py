"""Reading the training scripts' snapshots in their tests."""
import numpy


def snapshots(folder):
    """{iteration: path} of the ``snapshot_iter_N`` files in ``folder``."""
    return {int(p.name.rsplit('_', 1)[1]): p
            for p in folder.glob('snapshot_iter_*')}


def model_arrays(path):
    """The model's parameters and persistent values in a snapshot."""
    with numpy.load(str(path)) as npz:
        return {k: npz[k] for k in npz.files
                if k.startswith('updater/model:main/')}


def assert_same_model(expected_path, got_path, at_least=1):
    """The two snapshots hold the same model, bit for bit."""
    expected, got = model_arrays(expected_path), model_arrays(got_path)
    assert sorted(got) == sorted(expected) and len(got) >= at_least
    for k in expected:
        numpy.testing.assert_array_equal(got[k], expected[k], err_msg=k)
