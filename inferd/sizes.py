"""Sizes as people write them on a command line or in an environment variable.

`80GiB`, `24G` and `24Gi` are binary (2^30), `80GB` is decimal (10^9), a plain number is bytes;
K, M, G and T prefixes work alike.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgt])(i?)(b?))?\s*(?:bytes?)?\s*", re.I)
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str) -> int:
    """'80GiB' → 85899345920, '80GB' → 80000000000, '24G' → 24 GiB, '1024' → 1024."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"cannot parse {text!r} as a size (e.g. 80GiB, 80GB, 24G, 1073741824)")
    number, prefix, binary, b = m.groups()
    if prefix is None:
        return int(float(number))
    # A bare prefix ("24G") means binary units, as `free -g` and GPU spec sheets use them.
    base = 1000 if b and not binary else 1024
    return int(float(number) * base ** _POWERS[prefix.lower()])
