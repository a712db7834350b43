"""A stand-in for CuPy in the tests of dkha.solvers.eigen: arrays "on a device" (NumPy arrays
wrapped) that refuse every implicit conversion to NumPy, as CuPy's do, and a module with the
few CuPy functions the solver calls. Every copy to the host (``asnumpy``) is recorded, so a test
can show what reaches the host. Used only by tests/test_eigen_oracle.py."""

from __future__ import annotations

import sys
import types

import numpy as np

#: the shapes of the arrays copied to the host, in order
TO_HOST: list = []
#: the module name the solver finds through an array's type (``array_module``)
NAME = "dkha_device_stub"


def _raw(a):
    if isinstance(a, DeviceArray):
        return a.a
    if isinstance(a, tuple):
        return tuple(_raw(x) for x in a)
    if isinstance(a, np.ndarray):
        raise TypeError("a NumPy array where a device array is expected")
    return a


class DeviceArray:
    """A NumPy array held "on the device"."""

    __array_priority__ = 1000

    def __init__(self, a):
        self.a = a

    def __array__(self, *args, **kwargs):
        raise TypeError("implicit conversion of a device array to NumPy (use asnumpy)")

    shape = property(lambda self: self.a.shape)
    ndim = property(lambda self: self.a.ndim)
    dtype = property(lambda self: self.a.dtype)
    T = property(lambda self: DeviceArray(self.a.T))

    def reshape(self, *shape):
        return DeviceArray(self.a.reshape(*shape))

    def __len__(self):
        return len(self.a)

    def __getitem__(self, key):
        return DeviceArray(self.a[_raw(key)])

    def __setitem__(self, key, value):
        self.a[_raw(key)] = _raw(value)

    def __matmul__(self, other):
        return DeviceArray(self.a @ _raw(other))

    def __rmatmul__(self, other):
        return DeviceArray(_raw(other) @ self.a)

    def __sub__(self, other):
        return DeviceArray(self.a - _raw(other))

    def __iadd__(self, other):
        self.a += _raw(other)
        return self

    def __isub__(self, other):
        self.a -= _raw(other)
        return self

    def __mul__(self, other):
        return DeviceArray(self.a * _raw(other))

    def __truediv__(self, other):
        return DeviceArray(self.a / _raw(other))


DeviceArray.__module__ = NAME


def asarray(a, dtype=None):
    if isinstance(a, DeviceArray):
        return a if dtype is None else DeviceArray(a.a.astype(dtype, copy=False))
    return DeviceArray(np.array(a, dtype=dtype, copy=True))


def array(a, dtype=None, order="K", copy=True):
    return DeviceArray(np.array(_raw(a), dtype=dtype, order=order, copy=copy))


def asnumpy(a):
    TO_HOST.append(tuple(a.shape))
    return np.array(_raw(a))


def empty(shape, dtype=np.float64):
    return DeviceArray(np.empty(shape, dtype))


def zeros(shape, dtype=np.float64):
    return DeviceArray(np.zeros(shape, dtype))


def ascontiguousarray(a):
    return DeviceArray(np.ascontiguousarray(_raw(a)))


def _ufunc(f):
    def call(a, b, out=None):
        if out is None:
            return DeviceArray(f(_raw(a), _raw(b)))
        f(_raw(a), _raw(b), out=_raw(out))
        return out
    return call


def einsum(spec, *operands):
    return DeviceArray(np.asarray(np.einsum(spec, *(_raw(a) for a in operands))))


matmul, multiply, subtract = _ufunc(np.matmul), _ufunc(np.multiply), _ufunc(np.subtract)
linalg = types.SimpleNamespace(
    norm=lambda a, axis=None: DeviceArray(np.asarray(np.linalg.norm(_raw(a), axis=axis))),
    qr=lambda a: tuple(DeviceArray(x) for x in np.linalg.qr(_raw(a))))

sys.modules.setdefault(NAME, sys.modules[__name__])
