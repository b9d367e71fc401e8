"""The NumPy kernels: the fast CPU versions of the ops (threads of our own,
BLAS called directly, memory layouts that save passes)."""
