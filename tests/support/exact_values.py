"""Values of every type the encoding keeps exactly (hypothesis strategies), and ``same_shape`` to check them.

``==`` is not enough to say a value came back unchanged: ``[1] == [1]`` but
also ``(1,) != [1]`` only by luck of the types, and ``{1: x} == {1.0: x} ==
{True: x}``. ``same_shape`` compares types at every level, dict keys and
their order included, and treats NaN as equal to NaN (and -0.0 as distinct
from 0.0).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

# msgpack's own integers, and past them (extension type 2)
INTS_64 = st.integers(-(2**63), 2**64 - 1)
INTS = INTS_64 | st.integers(min_value=2**64) | st.integers(max_value=-(2**63) - 1)
SCALARS = st.none() | st.booleans() | INTS | st.floats() | st.text(max_size=8) | st.binary(max_size=8)
PLAIN_SCALARS = st.none() | st.booleans() | INTS_64 | st.floats() | st.text(max_size=8) | st.binary(max_size=8)
# dict keys and record keys: hashable, and no NaN (a NaN key never finds itself again, in any dict)
PLAIN_KEY_SCALARS = (
    st.none() | st.booleans() | INTS_64 | st.floats(allow_nan=False) | st.text(max_size=8) | st.binary(max_size=8)
)
KEY_SCALARS = PLAIN_KEY_SCALARS | INTS
KEYS = st.recursive(KEY_SCALARS, lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=6)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple) | st.dictionaries(KEYS, inner, max_size=4)
    ),
    max_leaves=20,
)
# values with no tuple and no int past 64 bits anywhere, keys included: what plain msgpack already kept
PLAIN_VALUES = st.recursive(
    PLAIN_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(PLAIN_KEY_SCALARS, inner, max_size=4),
    max_leaves=20,
)


def same_shape(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are equal and of the same types all the way down (dict keys, and their order, too)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_shape(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same_shape(ka, kb) and same_shape(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    return bool(a == b)
