"""minichain.dist.trace.timeline_plot: one step of a trace drawn as a PNG."""
import json

import pytest

from minichain.dist.trace import timeline, timeline_plot

pytest.importorskip('matplotlib', reason='matplotlib is not installed '
                    '(pip install matplotlib)')


def _step(t0):
    """One overlapped step's events, from t0 (seconds)."""
    return [('forward', t0, t0 + 1.0, None), ('backward', t0 + 1.0,
                                              t0 + 3.0, None),
            ('grad', t0 + 1.2, t0 + 1.2, 40), ('ready', t0 + 1.2, t0 + 1.2,
                                              40),
            ('pack', t0 + 1.2, t0 + 1.3, 40),
            ('bucket', t0 + 1.3, t0 + 2.0, 40),
            ('grad', t0 + 2.9, t0 + 2.9, 80), ('ready', t0 + 2.9, t0 + 2.9,
                                              80),
            ('bucket', t0 + 3.0, t0 + 3.2, 80),
            ('wait', t0 + 3.0, t0 + 3.2, None),
            ('unpack', t0 + 3.2, t0 + 3.3, 120),
            ('update', t0 + 3.3, t0 + 3.5, None)]


def test_the_window_is_rank_0s_step_and_the_png_is_written(tmp_path):
    trace = timeline.to_trace([_step(0.0) + _step(4.0),
                               _step(0.1) + _step(4.1)])
    assert timeline_plot.step_window(trace, 0) == (0.0, 3.5e6)
    assert timeline_plot.step_window(trace) == (4.0e6, 7.5e6)
    path = tmp_path / 'trace.json'
    path.write_text(json.dumps(trace))
    timeline_plot.main([str(path), str(tmp_path / 'step.png'), '--step',
                        '0'])
    assert (tmp_path / 'step.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_a_trace_without_steps_is_a_clear_error(tmp_path):
    trace = timeline.to_trace([[('allreduce', 0.0, 1.0, 8)]])
    with pytest.raises(ValueError, match='no forward and update of rank 0'):
        timeline_plot.plot(trace, tmp_path / 'x.png')
