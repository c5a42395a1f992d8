"""Hypothesis building blocks shared by the property tests: arbitrary JSON values (numbers too big for
a float, NaN, inf included) and a real document with some of its fields replaced by them."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)

# The numbers the numeric policy (harness.numeric) draws its lines between: beyond a C ssize_t or a float, near the
# float limit, subnormal, negative counts.
EXTREMES = (1.7e308, -1.7e308, 1e300, 5e-324, 2.2e-308, 1e-300, 2**62, 2**63, 2**70, 10**300, 10**400, -5, -1, 0, 1,
            2**31)
numbers = st.one_of(st.integers(min_value=-10**30, max_value=10**30), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(EXTREMES))
json_scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def with_fields_replaced(doc: dict, data: st.DataObject) -> dict:
    """A deep copy of `doc` with 1-3 of its fields (at any depth) replaced by arbitrary JSON values."""
    doc = json.loads(json.dumps(doc))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        path = data.draw(st.sampled_from(list(_paths(doc))[1:]))
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = data.draw(json_values)
    return doc

extreme_numbers = st.one_of(numbers, st.floats(min_value=-1e120, max_value=1e120))
