"""GPU-shaped convolutions: batched matrix products that land in NCHW.

The op bodies (``functions/convolution.py``) compute a convolution as
im2col over the whole batch, one GEMM, and a transposition back to NCHW;
a 1x1 layer there builds columns that are just its input. On a GPU every
such pass is a full trip through memory. Here:

* a 1x1 convolution is the batched product ``W @ x[n]`` over the images,
  read in place from NCHW and written in place into NCHW (``x[n]`` of shape
  (C, H*W) *is* its column matrix); a strided one first takes the pixels
  it reads;
* a larger window builds the columns of a group of images in one launch
  of the im2col kernel (``_elementwise.py``), in the layout
  (B, C*kh*kw, oh*ow), so that the batched product ``W @ col[b]`` is
  already (B, O, oh*ow), the output's own layout: no transposition;
* the input gradient (a deconvolution) of a 1x1 convolution is the
  batched ``W^T @ gy[n]``; of a stride-1 one, a convolution with the
  flipped kernel, again straight into NCHW; a strided one sums its
  columns into the pixels in one launch of the col2im kernel;
* the weight gradient is one 2-D GEMM per image group and group over
  channel-major columns (C*kh*kw, B*oh*ow), which cuBLAS reads transposed
  in place, with the group's gy transposed once.

The batched products are one cuBLAS call each (``_gemm.matmul``: W
broadcast over the batch with stride 0, float16 on tensor cores), the
rest plain ``xp`` code. The tests
run these functions on NumPy arrays, the two kernels emulated in C++
(``tests/functions/cuda_emulation.py``), against the op bodies at
ResNet-50's shapes. Whether float32 products use TF32 tensor
cores is :func:`minichain.backend.set_tf32`'s switch (off by default).

:func:`register` registers the three kernels for the ``'cuda'`` backend of
the kernel seam (:mod:`minichain.kernels`).
"""
from minichain import backend
from minichain.functions import convolution as _conv
from minichain.functions.geometry import Geometry, conv_outsize, is_pointwise
from minichain.kernels.cuda._elementwise import col2im, im2col
from minichain.kernels.cuda._gemm import matmul

# The columns of one image group at most this many bytes: large enough for
# cuBLAS to run near its peak on ResNet-50's layers (a 56x56 3x3 layer of
# 64 channels has 7 MiB of columns per image), small enough to leave the
# memory pool room for the activations.
COLUMN_BYTES = 256 << 20


def register(register_fn):
    """Register the kernels: ``register_fn(NodeType, 'cuda', kernel)``
    (``minichain.kernels.register``)."""
    register_fn(_conv.Convolution2D, 'cuda', convolution_2d)
    register_fn(_conv.Deconvolution2D, 'cuda', deconvolution_2d)
    register_fn(_conv.Convolution2DGradW, 'cuda', convolution_2d_grad_w)


# -- the kernels: the nodes' forward, same retained inputs --------------
def convolution_2d(node, inputs):
    """``Convolution2D.forward``: y = conv(x, W) (+ b)."""
    node.retain_inputs((0, 1))
    x, W = inputs[:2]
    k = W.shape[2:]
    out = tuple(conv_outsize(x.shape[2 + a], k[a], node.stride[a],
                             node.pad[a], node.cover_all, node.dilate[a])
                for a in (0, 1))
    y = conv_forward(x, W, _geometry(node, k, x.shape[2:], out), node.groups)
    if len(inputs) == 3:
        y += inputs[2].reshape(1, -1, 1, 1)
    return y,


def deconvolution_2d(node, inputs):
    """``Deconvolution2D.forward``: y = conv^T(x, W) (+ b)."""
    node.retain_inputs((0, 1))
    x, W = inputs[:2]
    g = _geometry(node, W.shape[2:], node.outsize, x.shape[2:])
    y = deconv_forward(x, W, g, node.groups)
    if len(inputs) == 3:
        y += inputs[2].reshape(1, -1, 1, 1)
    return y,


def convolution_2d_grad_w(node, inputs):
    """``Convolution2DGradW.forward``: gW from x and gy."""
    node.retain_inputs((0, 1))
    x, gy = inputs
    g = _geometry(node, node.w_shape[2:], x.shape[2:], gy.shape[2:])
    return conv_grad_w(x, gy, g, node.groups, node.w_shape),


def _geometry(node, k, in_size, out_size):
    return Geometry(k[0], k[1], node.stride[0], node.stride[1], node.pad[0],
                    node.pad[1], node.dilate[0], node.dilate[1], in_size[0],
                    in_size[1], out_size[0], out_size[1])


# -- array level ---------------------------------------------------------
def conv_forward(x, W, g, groups):
    """y (N, O, oh, ow) = conv(x (N, C, h, w), W (O, C/G, kh, kw))."""
    xp = backend.get_array_module(x)
    n, c = x.shape[:2]
    o = W.shape[0]
    p = g.oh * g.ow
    w = W.reshape(groups, o // groups, -1)        # (G, O/G, C/G*kh*kw)
    y = xp.empty((n, o, g.oh, g.ow), x.dtype)
    ys = y.reshape(n, groups, o // groups, p)      # NCHW, as the product's
    picked = _strided_pointwise(x, g)
    if picked is not None:                         # 1x1: no columns at all
        matmul(w, picked.reshape(n, groups, c // groups, p), out=ys)
        return y
    for n0, n1 in _image_groups(n, c * g.kh * g.kw * p * x.dtype.itemsize):
        col = im2col(x[n0:n1], g, batch_major=True)  # (B, C, kh, kw, oh, ow)
        matmul(w, col.reshape(n1 - n0, groups, -1, p), out=ys[n0:n1])
    return y


def deconv_forward(x, W, g, groups):
    """The adjoint of :func:`conv_forward` in its input: x (N, O, oh, ow)
    -> y (N, C, h, w), W the convolution's weight (O, C/G, kh, kw)."""
    xp = backend.get_array_module(x)
    n, o = x.shape[:2]
    c = W.shape[1] * groups
    p = g.oh * g.ow
    # W^T per group, (G, C/G*kh*kw, O/G): a copy of W, never of x
    wt = xp.ascontiguousarray(
        W.reshape(groups, o // groups, -1).transpose(0, 2, 1))
    xs = x.reshape(n, groups, o // groups, p)
    if is_pointwise(g):                            # 1x1: W^T @ x[n]
        return matmul(wt, xs).reshape(n, c, g.h, g.w)
    fpad = (g.dy * (g.kh - 1) - g.ph, g.dx * (g.kw - 1) - g.pw)
    if (g.sy, g.sx) == (1, 1) and min(fpad) >= 0:
        # conv^T with stride 1 is a convolution with the kernel flipped and
        # its channel axes swapped: into NCHW, no col2im
        flipped = Geometry(g.kh, g.kw, 1, 1, fpad[0], fpad[1], g.dy, g.dx,
                           g.oh, g.ow, g.h, g.w)
        return conv_forward(x, _flipped_weight(W, groups), flipped, groups)
    ys = [col2im(matmul(wt, xs[n0:n1]).reshape(
        n1 - n0, c, g.kh, g.kw, g.oh, g.ow), g, batch_major=True)
          for n0, n1 in _image_groups(n, c * g.kh * g.kw * p
                                      * x.dtype.itemsize)]
    return ys[0] if len(ys) == 1 else xp.concatenate(ys)


def conv_grad_w(x, gy, g, groups, w_shape):
    """gW (w_shape) of y = conv(x, W), from x and gy = dL/dy."""
    xp = backend.get_array_module(x)
    n, c = x.shape[:2]
    o = gy.shape[1]
    p = g.oh * g.ow
    k = c // groups * g.kh * g.kw
    acc = None
    picked = _strided_pointwise(x, g)
    for n0, n1 in _image_groups(n, c * g.kh * g.kw * p * x.dtype.itemsize):
        b = n1 - n0
        if picked is not None:                     # 1x1: x's pixels, C first
            col = xp.ascontiguousarray(
                picked[n0:n1].reshape(b, c, p).transpose(1, 0, 2))
        else:                                      # (C, kh, kw, B, oh, ow)
            col = im2col(x[n0:n1], g, batch_major=False)
        col = col.reshape(groups, k, b * p)
        gyt = xp.ascontiguousarray(gy[n0:n1].reshape(
            b, groups, o // groups, p).transpose(1, 2, 0, 3)).reshape(
                groups, o // groups, b * p)
        part = xp.empty((groups, o // groups, k), x.dtype)
        if groups == 1:  # 2-D: cuBLAS reads col[0].T in place
            xp.dot(gyt[0], col[0].T, out=part[0])
        else:  # one batched launch, not one per group
            xp.matmul(gyt, col.transpose(0, 2, 1), out=part)
        acc = part if acc is None else xp.add(acc, part, out=acc)
    return acc.reshape(w_shape)


# -- helpers -------------------------------------------------------------
def _image_groups(n, column_bytes_per_image):
    """range(n) in runs of images whose columns fit in COLUMN_BYTES."""
    b = max(1, min(n, COLUMN_BYTES // max(1, column_bytes_per_image)))
    return [(i, min(n, i + b)) for i in range(0, n, b)]


def _strided_pointwise(x, g):
    """For a 1x1 window without padding, the pixels it reads, (N, C, oh,
    ow) (x itself at stride 1; a strided one is copied, which a GPU GEMM
    would do anyway); else None."""
    if g.kh != 1 or g.kw != 1 or g.ph or g.pw:
        return None
    if is_pointwise(g):
        return x
    picked = x[:, :, ::g.sy, ::g.sx]
    if picked.shape[2:] != (g.oh, g.ow):           # cover_all reads padding
        return None
    return backend.get_array_module(x).ascontiguousarray(picked)


def _flipped_weight(W, groups):
    """W (O, C/G, kh, kw) -> (C, O/G, kh, kw), each kernel turned 180 deg."""
    o, cg, kh, kw = W.shape
    wf = W.reshape(groups, o // groups, cg, kh, kw).transpose(0, 2, 1, 3, 4)
    return backend.get_array_module(W).ascontiguousarray(
        wf[:, :, :, ::-1, ::-1]).reshape(groups * cg, o // groups, kh, kw)
