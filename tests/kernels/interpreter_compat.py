"""Triton's CPU interpreter (TRITON_INTERPRET=1) as the kernel tests need it.

Triton 3.6's interpreter turns a tensor into a Python int with int(array), which numpy 2.4
refuses for an array of one element that is not 0-d, so a range() over a bound computed at run
time (a kernel's loop over key or K tiles) fails there while it compiles and runs on a GPU.
one_element_indices() makes the interpreter's tensors index through .item() for as long as it
is active; the kernels stay as the GPU runs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def one_element_indices() -> Iterator[None]:
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patched
    try:
        yield
    finally:
        interpreter._patch_lang_tensor = patch_tensor
