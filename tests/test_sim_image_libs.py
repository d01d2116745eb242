"""The serving image carries the system libraries torch loads, not torch's own: those come
with the read-only mount of torch's site-packages (sparksim/serving.py). Copied in, they
were 434 MB of a 470 MB tarball, imported into every node's engine at every sim up."""

from __future__ import annotations

import os
import sys

import pytest

from sparksim import image


def test_the_image_carries_no_copy_of_the_mounted_torch() -> None:
    site = image.torch_site()
    if site is None:
        pytest.skip("this Python has no torch: nothing is mounted")
    libs = image.image_libraries([os.path.realpath(sys.executable)])
    copied = sorted(lib for lib in libs if os.path.realpath(lib).startswith(f"{site}/"))
    assert not copied, f"torch's own libraries copied into the image: {copied[:3]}"
    # What torch's libraries load from the system still comes (libtorch_cpu needs these).
    names = {os.path.basename(lib) for lib in libs}
    assert {"libstdc++.so.6", "libgcc_s.so.1"} <= names, sorted(names)
