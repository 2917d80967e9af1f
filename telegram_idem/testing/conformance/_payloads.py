"""Texts and bytes a store must keep exactly, though a text column would refuse them.

An update may carry what JSON allows and text columns refuse: a lone UTF-16 surrogate
escape (``"\\ud800"``), a NUL escape (``"\\u0000"``), emoji, right-to-left text. The
ingress encodes it ASCII-safe, but a store must not depend on that: the inbox hands back
the exact bytes it admitted, a record the exact result bytes, whatever they are.
"""

from __future__ import annotations

import json

__all__ = ["ODD_PAYLOADS", "ODD_TEXTS"]

ODD_TEXTS = [
    "\ud800",  # a lone high surrogate
    "\udfff tail",  # a lone low surrogate
    "a\u0000b",  # NUL
    "👍🏽 emoji, ZWJ 👨‍👩‍👧",
    "שלום עולם \u202e RTL override",
]
"""Message texts that are valid JSON string content but not storable as text as they are."""

ODD_PAYLOADS = [
    *(json.dumps({"update_id": 1, "message": {"text": t}}).encode() for t in ODD_TEXTS),
    *(
        json.dumps({"update_id": 1, "message": {"text": t}}, ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )
        for t in ODD_TEXTS
    ),
    b'{"update_id":1,"message":{"text":"\\ud800"}}',
    b"\x00\xff\xfe not even UTF-8 \x80",
]
"""Update payloads carrying :data:`ODD_TEXTS` (ASCII-escaped and raw), and bytes that are
not UTF-8 at all."""
