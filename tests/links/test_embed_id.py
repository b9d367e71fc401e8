import numpy

import minichain
from minichain import links as L


def test_embed_id_link():
    link = L.EmbedID(7, 4, ignore_label=-1)
    assert link.W.shape == (7, 4) and link.W.dtype == numpy.float32
    assert [p for p, _ in link.namedparams()] == ['/W']
    y = link(numpy.array([3, -1], numpy.int32))
    numpy.testing.assert_array_equal(y.array[0], link.W.array[3])
    assert (y.array[1] == 0).all()
    minichain.functions.sum(y).backward()
    numpy.testing.assert_array_equal(link.W.grad.sum(axis=1),
                                     [0, 0, 0, 4, 0, 0, 0])
    W = numpy.arange(6.0).reshape(3, 2)
    assert (L.EmbedID(3, 2, initialW=W).W.array == W).all()
