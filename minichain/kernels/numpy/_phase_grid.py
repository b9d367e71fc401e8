"""Window operations on the CPU as long contiguous slices (for pooling).

NumPy runs a ufunc over a strided 4-D view (every second pixel, a
sub-block of rows) 10-15 times slower than over a contiguous run, so the
pooling kernels never touch such views inside their loop over the kh*kw
kernel offsets. Instead the input is split once into its sy*sx stride
*phases* (``x[..., a::sy, b::sx]``), each padded to a common grid of
``hq x wq`` cells and flattened per (n, c) plane. Kernel offset (ky, kx)
then reads phase ((ky - ph) % sy, (kx - pw) % sx) at a constant flat shift:
one contiguous slice of length ``oh * wq`` per plane. Results live on an
(oh, wq) grid whose columns past ``ow`` are scratch, cropped at the end.
"""
import numpy


class PhaseGrid:
    """The phase layout for geometry ``g`` (``_im2col.Geometry``)."""

    def __init__(self, g):
        self.g = g
        qy = [(ky * g.dy - g.ph) // g.sy for ky in range(g.kh)]
        qx = [(kx * g.dx - g.pw) // g.sx for kx in range(g.kw)]
        self.t0, self.u0 = min(qy), min(qx)
        # One spare row keeps the last slice (shift + oh*wq) inside a plane.
        self.hq = g.oh + max(qy) - self.t0 + 1
        self.wq = g.ow + max(qx) - self.u0
        self.length = g.oh * self.wq
        self.offsets = []
        for ky in range(g.kh):
            for kx in range(g.kw):
                a, b = (ky * g.dy - g.ph) % g.sy, (kx * g.dx - g.pw) % g.sx
                shift = (qy[ky] - self.t0) * self.wq + qx[kx] - self.u0
                self.offsets.append((ky * g.kw + kx, a, b, shift))

    def _blocks(self):
        """(a, b, phase rows, phase cols, x rows, x cols) of real pixels."""
        g = self.g
        for a in range(g.sy):
            rows = max(0, min(-(-(g.h - a) // g.sy), self.hq + self.t0))
            for b in range(g.sx):
                cols = max(0, min(-(-(g.w - b) // g.sx), self.wq + self.u0))
                yield (a, b, slice(-self.t0, -self.t0 + rows),
                       slice(-self.u0, -self.u0 + cols),
                       slice(a, a + (rows - 1) * g.sy + 1, g.sy),
                       slice(b, b + (cols - 1) * g.sx + 1, g.sx))

    def split(self, x, fill):
        """x (N, C, h, w) -> phases (sy, sx, N*C, hq*wq), padded with fill."""
        g = self.g
        nc = x.shape[0] * x.shape[1]
        ph = numpy.full((g.sy, g.sx, nc, self.hq, self.wq), fill, x.dtype)
        x3 = x.reshape(nc, g.h, g.w)
        for a, b, pr, pc, xr, xc in self._blocks():
            ph[a, b, :, pr, pc] = x3[:, xr, xc]
        return ph.reshape(g.sy, g.sx, nc, -1)

    def zeros(self, nc, dtype):
        """Phases (sy, sx, nc, hq*wq) of zeros, to sum into and merge."""
        return numpy.zeros((self.g.sy, self.g.sx, nc, self.hq * self.wq),
                           dtype)

    def merge(self, ph, lead):
        """Inverse of split (padding dropped): phases -> a fresh (N, C, h,
        w), ``lead`` = (N, C)."""
        g = self.g
        out = numpy.zeros(tuple(lead) + (g.h, g.w), ph.dtype)
        o3 = out.reshape(-1, g.h, g.w)
        ph = ph.reshape(g.sy, g.sx, -1, self.hq, self.wq)
        for a, b, pr, pc, xr, xc in self._blocks():
            o3[:, xr, xc] = ph[a, b, :, pr, pc]
        return out

    def window(self, ph, a, b, shift):
        """The (N*C, oh*wq) slice that one kernel offset reads."""
        return ph[a, b, :, shift:shift + self.length]

    def expand(self, y, fill):
        """(N, C, oh, ow) -> (N*C, oh*wq) with fill in the scratch columns."""
        nc = y.shape[0] * y.shape[1]
        full = numpy.full((nc, self.g.oh, self.wq), fill, y.dtype)
        full[:, :, :self.g.ow] = y.reshape(nc, self.g.oh, self.g.ow)
        return full.reshape(nc, -1)

    def crop(self, full, lead):
        """(N*C, oh*wq) -> a fresh (N, C, oh, ow)."""
        g = self.g
        return numpy.ascontiguousarray(
            full.reshape(-1, g.oh, self.wq)[:, :, :g.ow]).reshape(
                tuple(lead) + (g.oh, g.ow))
