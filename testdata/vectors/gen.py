#!/usr/bin/env python3
"""Generates topspin's shared wire test vectors and docs/protocol-examples.md.

The bytes come from the small encoder below, written from docs/protocol.md alone with
struct.pack (standard library only), so that every implementation is checked against a second,
independent one rather than against itself. The JSON format is described in README.md beside
this file.

    python3 testdata/vectors/gen.py          # rewrite the JSON files and the examples document
    python3 testdata/vectors/gen.py --check  # exit 1 if any of them is out of date
"""

from __future__ import annotations

import json
import struct
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
EXAMPLES_DOC = ROOT / "docs" / "protocol-examples.md"

# --- protocol constants (protocol.md §2, §4, §5, §10, §11) ---------------------------------------

PREFACE = b"TOPSPIN\x01"

FRAME_TYPES = {
    "SETTINGS": 0x01,
    "CALL": 0x02,
    "MESSAGE": 0x03,
    "CONTINUATION": 0x04,
    "HEADERS": 0x05,
    "HALF_CLOSE": 0x06,
    "END": 0x07,
    "CANCEL": 0x08,
    "CREDIT": 0x09,
    "PING": 0x0A,
    "GOAWAY": 0x0B,
    "ERROR": 0x0C,
}

FLAG_NAMES = {
    "CALL": {0x01: "NAMED"},
    "MESSAGE": {0x01: "END_STREAM", 0x02: "SPLIT"},
    "PING": {0x01: "ACK"},
}

SETTINGS = {
    "MAX_FRAME_SIZE": (1, 16_777_216),
    "MAX_CONCURRENT_CALLS": (2, 1024),
    "INITIAL_CALL_WINDOW": (3, 1_048_576),
    "MAX_MESSAGE_SIZE": (4, 67_108_864),
    "MAX_METADATA_SIZE": (5, 16_384),
}
SETTING_NAMES = {sid: name for name, (sid, _) in SETTINGS.items()}
DEFAULT_SETTINGS = {name: default for name, (_, default) in SETTINGS.items()}

ERROR_CODES = [
    "NO_ERROR",
    "BAD_PREFACE",
    "UNSUPPORTED_VERSION",
    "SETTINGS_ERROR",
    "FRAME_TOO_LARGE",
    "UNKNOWN_FRAME_TYPE",
    "MALFORMED_FRAME",
    "ILLEGAL_FRAME",
    "UNKNOWN_CALL",
    "DUPLICATE_CALL",
    "METHOD_ID_ERROR",
    "FLOW_CONTROL",
    "MESSAGE_LENGTH_MISMATCH",
    "TIMEOUT",
    "INTERNAL_ERROR",
    "ENHANCE_YOUR_CALM",
]

STATUS_CODES = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
]

MAX_WINDOW = 2**31 - 1


def u8(v: int) -> bytes:
    return struct.pack("<B", v)


def u16(v: int) -> bytes:
    return struct.pack("<H", v)


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


# --- hex in JSON ---------------------------------------------------------------------------------

RUN_MIN = 64  # runs of one byte at least this long are written as {"repeat", "count"}


def hexval(b: bytes) -> str | list:
    """A hex value as README.md describes it: a string, or parts with long runs compressed."""
    parts: list = []
    lit = bytearray()
    i = 0
    while i < len(b):
        j = i
        while j < len(b) and b[j] == b[i]:
            j += 1
        if j - i >= RUN_MIN:
            if lit:
                parts.append(lit.hex())
                lit = bytearray()
            parts.append({"repeat": b[i : i + 1].hex(), "count": j - i})
        else:
            lit += b[i:j]
        i = j
    if not parts:
        return lit.hex()
    if lit:
        parts.append(lit.hex())
    return parts


def unhexval(v: str | list) -> bytes:
    if isinstance(v, str):
        return bytes.fromhex(v)
    out = b""
    for p in v:
        out += (
            bytes.fromhex(p)
            if isinstance(p, str)
            else bytes.fromhex(p["repeat"]) * p["count"]
        )
    return out


# --- the encoder: every frame is a list of labelled byte segments ---------------------------------


def is_bin_key(key: str) -> bool:
    return key.endswith("-bin")


def md_json(entries) -> list:
    out = []
    for k, v in entries:
        if is_bin_key(k):
            out.append({"key": k, "value_hex": hexval(v)})
        else:
            out.append({"key": k, "value": v})
    return out


def md_segs(entries, what: str = "metadata") -> list:
    segs = [(u16(len(entries)), f"{what}: count = {len(entries)}")]
    for k, v in entries:
        kb = k.encode()
        vb = v if isinstance(v, bytes) else v.encode("utf-8")
        segs.append((u8(len(kb)), f"  key_len = {len(kb)}"))
        segs.append((u16(len(vb)), f"  value_len = {len(vb)}"))
        segs.append((kb, f"  key = {k!r}"))
        if is_bin_key(k):
            segs.append((vb, f"  value = {len(vb)} binary bytes"))
        else:
            segs.append((vb, f"  value = {v!r}"))
    return segs


def md_size(entries) -> int:
    return len(b"".join(b for b, _ in md_segs(entries)))


def flags_label(ty_name: str, flags: int) -> str:
    names = [n for bit, n in FLAG_NAMES.get(ty_name, {}).items() if flags & bit]
    undefined = flags & ~sum(FLAG_NAMES.get(ty_name, {}))
    if undefined:
        names.append(f"undefined 0x{undefined:02x}")
    return f"flags = 0x{flags:02x}" + (f" ({' | '.join(names)})" if names else "")


class Frame:
    """One encoded frame: its labelled bytes and its fields as the vectors write them."""

    def __init__(
        self, ty_name, flags, call_id, segs, fields, *, ty=None, reserved=0, length=None
    ):
        payload = b"".join(b for b, _ in segs)
        ty = FRAME_TYPES[ty_name] if ty is None else ty
        length = len(payload) if length is None else length
        self.segs = [
            (u32(length), f"length = {length}"),
            (u8(ty), f"type = 0x{ty:02x} ({ty_name})"),
            (u8(flags), flags_label(ty_name, flags)),
            (u16(reserved), "reserved" + (f" = 0x{reserved:04x}" if reserved else "")),
            (u32(call_id), f"call_id = {call_id}"),
        ] + segs
        self.bytes = b"".join(b for b, _ in self.segs)
        self.fields = {"type": ty_name, "flags": flags, "call_id": call_id, **fields}
        self.ty_name = ty_name


def settings(entries, call_id=0) -> Frame:
    effective = dict(DEFAULT_SETTINGS)
    segs = []
    for sid, value in entries:
        name = SETTING_NAMES.get(sid)
        if name:
            effective[name] = value
        segs.append(
            (
                u16(sid),
                f"id = {sid}" + (f" ({name})" if name else " (unknown: ignored)"),
            )
        )
        segs.append((u32(value), f"value = {value}"))
    fields = {
        "entries": [{"id": sid, "value": v} for sid, v in entries],
        "settings": effective,
    }
    return Frame("SETTINGS", 0, call_id, segs, fields)


def call(call_id, method_id, name, *, codec=0, timeout_us=0, metadata=()) -> Frame:
    metadata = list(metadata)
    segs = [
        (u16(method_id), f"method_id = {method_id}"),
        (u8(codec), f"codec = {codec}"),
        (u8(0), "rsv"),
        (u64(timeout_us), f"timeout_us = {timeout_us}"),
    ]
    if name is not None:
        nb = name.encode("utf-8")
        segs.append((u16(len(nb)), f"name_len = {len(nb)}"))
        segs.append(
            (nb, f"name = {name!r}" if len(nb) <= 64 else f"name = {len(nb)} bytes")
        )
    segs += md_segs(metadata)
    fields = {
        "method_id": method_id,
        "method_name": name,
        "codec": codec,
        "timeout_us": timeout_us,
        "metadata": md_json(metadata),
    }
    return Frame("CALL", 1 if name is not None else 0, call_id, segs, fields)


def message(call_id, data: bytes, *, end_stream=False, total_len=None) -> Frame:
    flags = (1 if end_stream else 0) | (2 if total_len is not None else 0)
    segs = []
    if total_len is not None:
        segs.append((u32(total_len), f"total_len = {total_len}"))
    segs.append((data, f"chunk = {len(data)} bytes"))
    fields = {
        "end_stream": end_stream,
        "total_len": total_len,
        "chunk_hex": hexval(data),
    }
    return Frame("MESSAGE", flags, call_id, segs, fields)


def continuation(call_id, data: bytes) -> Frame:
    return Frame(
        "CONTINUATION",
        0,
        call_id,
        [(data, f"chunk = {len(data)} bytes")],
        {"chunk_hex": hexval(data)},
    )


def headers(call_id, metadata=()) -> Frame:
    metadata = list(metadata)
    return Frame(
        "HEADERS", 0, call_id, md_segs(metadata), {"metadata": md_json(metadata)}
    )


def half_close(call_id) -> Frame:
    return Frame("HALF_CLOSE", 0, call_id, [], {})


def end(call_id, code="OK", msg="", trailers=()) -> Frame:
    trailers = list(trailers)
    mb = msg.encode("utf-8")
    segs = [
        (u16(STATUS_CODES.index(code)), f"code = {STATUS_CODES.index(code)} ({code})"),
        (u16(len(mb)), f"msg_len = {len(mb)}"),
        (mb, f"message = {msg!r}"),
    ] + md_segs(trailers, "trailers")
    fields = {"code": code, "message": msg, "trailers": md_json(trailers)}
    return Frame("END", 0, call_id, segs, fields)


def cancel(call_id, code) -> Frame:
    n = STATUS_CODES.index(code)
    return Frame(
        "CANCEL", 0, call_id, [(u16(n), f"code = {n} ({code})")], {"code": code}
    )


def credit(call_id, increment) -> Frame:
    return Frame(
        "CREDIT",
        0,
        call_id,
        [(u32(increment), f"increment = {increment}")],
        {"increment": increment},
    )


def ping(data: bytes, ack=False) -> Frame:
    return Frame(
        "PING",
        1 if ack else 0,
        0,
        [(data, "data")],
        {"ack": ack, "data_hex": hexval(data)},
    )


def goaway(last_call_id, code="NO_ERROR", reason="") -> Frame:
    rb = reason.encode("utf-8")
    n = ERROR_CODES.index(code)
    segs = [
        (u32(last_call_id), f"last_call_id = {last_call_id}"),
        (u16(n), f"code = {n} ({code})"),
        (u16(len(rb)), f"reason_len = {len(rb)}"),
        (rb, f"reason = {reason!r}"),
    ]
    return Frame(
        "GOAWAY",
        0,
        0,
        segs,
        {"last_call_id": last_call_id, "code": code, "reason": reason},
    )


def error(code, reason="") -> Frame:
    rb = reason.encode("utf-8")
    n = ERROR_CODES.index(code)
    segs = [
        (u16(n), f"code = {n} ({code})"),
        (u16(len(rb)), f"reason_len = {len(rb)}"),
        (rb, f"reason = {reason!r}"),
    ]
    return Frame("ERROR", 0, 0, segs, {"code": code, "reason": reason})


def extension(ty, flags, call_id, payload: bytes) -> Frame:
    return Frame(
        "EXTENSION",
        flags,
        call_id,
        [(payload, f"payload = {len(payload)} bytes")],
        {"ext_type": ty, "payload_hex": hexval(payload)},
        ty=ty,
    )


def raw(ty, flags, call_id, payload: bytes, *, length=None, reserved=0) -> bytes:
    """Any frame, valid or not: header fields and payload as given."""
    n = len(payload) if length is None else length
    return u32(n) + u8(ty) + u8(flags) + u16(reserved) + u32(call_id) + payload


def md_raw(entries) -> bytes:
    """A metadata block from raw (key bytes, value bytes) pairs, unchecked."""
    out = u16(len(entries))
    for k, v in entries:
        out += u8(len(k)) + u16(len(v)) + k + v
    return out


def call_fixed(method_id=0, codec=0, timeout_us=0) -> bytes:
    return u16(method_id) + u8(codec) + u8(0) + u64(timeout_us)


def wire(*parts) -> bytes:
    return b"".join(p.bytes if isinstance(p, Frame) else p for p in parts)


# --- frame vectors -------------------------------------------------------------------------------


def fv(name, description, frame: Frame, *, max_frame_size=None):
    v = {"name": name, "description": description, "kind": "frame"}
    if max_frame_size is not None:
        v["max_frame_size"] = max_frame_size
    v["hex"] = hexval(frame.bytes)
    v["frame"] = dict(frame.fields)
    return v


def fv_decode_only(name, description, data: bytes, fields: dict):
    return {
        "name": name,
        "description": description,
        "kind": "frame",
        "hex": hexval(data),
        "frame": fields,
        "roundtrip": False,
    }


def fv_err(name, description, data: bytes, code: str, *, max_frame_size=None):
    assert code in ERROR_CODES, code
    v = {"name": name, "description": description, "kind": "frame"}
    if max_frame_size is not None:
        v["max_frame_size"] = max_frame_size
    v["hex"] = hexval(data)
    v["error"] = code
    return v


def with_flags(f: Frame, flags: int, reserved: int = 0) -> bytes:
    """The frame's bytes with other header flags/reserved bits (for decode-only vectors)."""
    b = bytearray(f.bytes)
    b[5] = flags
    b[6:8] = u16(reserved)
    return bytes(b)


def frames_valid() -> list:
    d = DEFAULT_SETTINGS
    unicode_md = [
        ("greeting", "grüße 👋"),
        ("trace-bin", bytes([0x00, 0xFF, 0x80, 0x7F])),
        ("greeting", "again"),
        ("empty-bin", b""),
        ("x.y_z-1", ""),
    ]
    v = [
        fv(
            "settings_empty_all_defaults",
            "SETTINGS with no entries: every setting has its default (protocol.md §4).",
            settings([]),
        ),
        fv(
            "settings_all_five_defaults",
            "SETTINGS naming all five settings with their default values, in id order.",
            settings([(SETTINGS[n][0], d[n]) for n in SETTINGS]),
        ),
        fv(
            "settings_custom_values",
            "SETTINGS with every setting changed, MAX_FRAME_SIZE at its minimum 16384.",
            settings([(1, 16_384), (2, 100), (3, 65_535), (4, 4_194_304), (5, 8_192)]),
        ),
        fv(
            "settings_range_limits",
            "SETTINGS with every value at the edge of its valid range (§4 table).",
            settings(
                [(1, MAX_WINDOW), (2, 0), (3, MAX_WINDOW), (4, 2**32 - 1), (5, 4)]
            ),
        ),
        fv(
            "settings_unknown_ids_ignored",
            "Unknown setting ids (0x0099, 0xffff) are ignored (§4, §12); the known one applies.",
            settings([(0x99, 7), (4, 1000), (0xFFFF, 0xFFFFFFFF)]),
        ),
        fv(
            "settings_repeated_id_last_wins",
            "A repeated setting id: the last value wins (§4).",
            settings([(4, 10), (2, 5), (4, 20)]),
        ),
        fv(
            "call_named_only",
            "CALL with NAMED set and method_id 0: the name is used for this call only (§5.2).",
            call(1, 0, "/p.S/M"),
        ),
        fv(
            "call_named_binding_with_timeout",
            "CALL naming the method and binding it to method_id 1, with a 1.5 s timeout and one "
            "text metadata entry.",
            call(
                1,
                1,
                "/echo.Echo/Say",
                timeout_us=1_500_000,
                metadata=[("user-agent", "topspin/0.1")],
            ),
        ),
        fv(
            "call_interned",
            "CALL by interned method id 1 (NAMED clear), JSON codec (2), no metadata.",
            call(3, 1, None, codec=2),
        ),
        fv(
            "call_binary_and_unicode_metadata",
            "CALL with a non-ASCII method name, raw codec (1), and metadata with unicode text, "
            "binary -bin values (including an empty one), a repeated key and an empty text value.",
            call(5, 0, "/ünï.Cödé/Grüße", codec=1, metadata=unicode_md),
        ),
        fv(
            "call_limits",
            "CALL at the edges: call_id 2^32-1, method_id 1023 (highest), private-use codec 255, "
            "the largest timeout_us.",
            call(0xFFFFFFFF, 1023, "/a.B/C", codec=255, timeout_us=2**64 - 1),
        ),
        fv(
            "call_name_1024_bytes",
            "CALL whose method name has the maximum length, 1024 bytes.",
            call(7, 0, "/" + "m" * 1023),
        ),
        fv(
            "message_whole",
            "A whole message in one MESSAGE frame.",
            message(1, b"hello"),
        ),
        fv(
            "message_empty",
            "An empty (0-byte) message in one MESSAGE frame.",
            message(1, b""),
        ),
        fv(
            "message_end_stream",
            "MESSAGE with END_STREAM: the client's last message (§5.3).",
            message(1, b"last", end_stream=True),
        ),
        fv(
            "message_end_stream_empty",
            "An empty last message: MESSAGE with END_STREAM and no payload.",
            message(9, b"", end_stream=True),
        ),
        fv(
            "message_split_first_chunk",
            "MESSAGE with SPLIT: total_len 10 then the first 3-byte chunk.",
            message(1, b"abc", total_len=10),
        ),
        fv(
            "message_split_empty_first_chunk",
            "MESSAGE with SPLIT whose first chunk is empty (shorter than total_len, so allowed).",
            message(1, b"", total_len=5),
        ),
        fv(
            "message_split_end_stream",
            "MESSAGE with SPLIT and END_STREAM (flags 0x03).",
            message(2, b"ab", total_len=4, end_stream=True),
        ),
        fv("continuation", "A CONTINUATION chunk.", continuation(1, b"defg")),
        fv(
            "continuation_empty",
            "An empty CONTINUATION chunk (allowed, §5.3).",
            continuation(1, b""),
        ),
        fv(
            "message_max_frame_size_payload",
            "A MESSAGE whose payload is exactly the decoder's MAX_FRAME_SIZE, 16384 bytes.",
            message(1, b"\xab" * 16_384),
            max_frame_size=16_384,
        ),
        fv("headers_empty", "HEADERS with an empty metadata block.", headers(1)),
        fv(
            "headers_with_metadata",
            "HEADERS with a text and a binary entry.",
            headers(
                3,
                [
                    ("content-type", "application/grpc+proto"),
                    ("id-bin", bytes([0, 255])),
                ],
            ),
        ),
        fv("half_close", "HALF_CLOSE: empty payload.", half_close(1)),
        fv("end_ok", "END with status OK, empty message and no trailers.", end(1)),
        fv(
            "end_with_message_and_trailers",
            "END with a status message and trailers, including topspin-status-details-bin.",
            end(
                3,
                "NOT_FOUND",
                "no such key: 'apple' — sorry",
                [
                    ("retry-after", "5"),
                    ("topspin-status-details-bin", bytes(range(20))),
                ],
            ),
        ),
        fv(
            "end_unauthenticated",
            "END with the highest status code, 16.",
            end(1, "UNAUTHENTICATED", "who are you?"),
        ),
        fv("cancel_cancelled", "CANCEL with CANCELLED (1).", cancel(1, "CANCELLED")),
        fv(
            "cancel_deadline_exceeded",
            "CANCEL with DEADLINE_EXCEEDED (4).",
            cancel(2, "DEADLINE_EXCEEDED"),
        ),
        fv(
            "cancel_resource_exhausted",
            "CANCEL with RESOURCE_EXHAUSTED (8).",
            cancel(3, "RESOURCE_EXHAUSTED"),
        ),
        fv("credit_one", "CREDIT with the smallest increment, 1.", credit(1, 1)),
        fv(
            "credit_max",
            "CREDIT with the largest increment, 2^31-1.",
            credit(1, MAX_WINDOW),
        ),
        fv(
            "ping", "PING with 8 opaque bytes.", ping(bytes.fromhex("0102030405060708"))
        ),
        fv(
            "ping_ack",
            "PING with ACK: the answer, same 8 bytes.",
            ping(bytes.fromhex("0102030405060708"), ack=True),
        ),
        fv(
            "goaway_graceful",
            "GOAWAY NO_ERROR with last_call_id 41 and a reason.",
            goaway(41, "NO_ERROR", "server shutting down"),
        ),
        fv(
            "goaway_idle_timeout",
            "GOAWAY with a non-zero code (TIMEOUT) and last_call_id 0.",
            goaway(0, "TIMEOUT", "idle for 300 s"),
        ),
        fv(
            "error_frame",
            "ERROR with FLOW_CONTROL and a reason.",
            error("FLOW_CONTROL", "call 3 sent a 40-byte frame without credit"),
        ),
        fv(
            "error_empty_reason", "ERROR with an empty reason.", error("INTERNAL_ERROR")
        ),
        fv(
            "error_enhance_your_calm",
            "ERROR ENHANCE_YOUR_CALM (15): the peer went past a local limit (§9, §10).",
            error("ENHANCE_YOUR_CALM", "too_many_pings"),
        ),
        fv(
            "extension_0x80_on_connection",
            "Ignorable extension frame type 0x80 on call 0: decoded as EXTENSION and skipped by "
            "a receiver that does not know it (§12).",
            extension(0x80, 0, 0, b"future"),
        ),
        fv(
            "extension_0xff_with_flags_on_call",
            "Ignorable extension frame type 0xff, with flags, on call 7, empty payload.",
            extension(0xFF, 0xA5, 7, b""),
        ),
    ]
    hc = half_close(1)
    v.append(
        fv_decode_only(
            "reserved_bytes_ignored",
            "The header's reserved bytes are not zero: they MUST be ignored (§3). Decode only: "
            "an encoder writes them as zero.",
            with_flags(hc, 0, 0xFFFF),
            hc.fields,
        )
    )
    m = message(1, b"x")
    v.append(
        fv_decode_only(
            "message_undefined_flags_ignored",
            "MESSAGE with undefined flag bits 0xfc set: ignored (§3), so neither END_STREAM nor "
            "SPLIT. Decode only; `flags` is the byte on the wire.",
            with_flags(m, 0xFC),
            {**m.fields, "flags": 0xFC},
        )
    )
    p = ping(b"abcdefgh")
    v.append(
        fv_decode_only(
            "ping_undefined_flags_ignored",
            "PING with flags 0xfe: ACK (0x01) is clear, the rest undefined and ignored.",
            with_flags(p, 0xFE),
            {**p.fields, "flags": 0xFE},
        )
    )
    cn = cancel(4, "CANCELLED")
    v.append(
        fv_decode_only(
            "cancel_undefined_flags_ignored",
            "CANCEL (a type without flags) with flags 0xff: ignored.",
            with_flags(cn, 0xFF),
            {**cn.fields, "flags": 0xFF},
        )
    )
    v.append(
        fv_decode_only(
            "end_unknown_status_code",
            "END with status code 99: a receiver maps codes above 16 to UNKNOWN, keeping the "
            "message (§11). Decode only.",
            raw(0x07, 0, 1, u16(99) + u16(4) + b"huh?" + u16(0)),
            {
                "type": "END",
                "flags": 0,
                "call_id": 1,
                "code": "UNKNOWN",
                "message": "huh?",
                "trailers": [],
            },
        )
    )
    v.append(
        fv_decode_only(
            "goaway_unknown_error_code",
            "GOAWAY with error code 300: a receiver handles an error code it does not know like "
            "INTERNAL_ERROR and keeps its number, written here as a number (§10). Decode only.",
            raw(0x0B, 0, 0, u32(5) + u16(300) + u16(0)),
            {
                "type": "GOAWAY",
                "flags": 0,
                "call_id": 0,
                "last_call_id": 5,
                "code": 300,
                "reason": "",
            },
        )
    )
    return v


def frames_invalid() -> list:
    M = "MALFORMED_FRAME"
    big_header = raw(0x03, 0, 1, b"", length=16_385)
    return [
        fv_err(
            "frame_too_large_by_one",
            "length 16385 with MAX_FRAME_SIZE 16384. The hex is the header alone: the error MUST "
            "be found from the header, before the payload arrives (§3).",
            big_header,
            "FRAME_TOO_LARGE",
            max_frame_size=16_384,
        ),
        fv_err(
            "frame_too_large_4gb_length",
            "A 4 GB length prefix (0xffffffff) with the default MAX_FRAME_SIZE; header alone.",
            raw(0x03, 0, 1, b"", length=0xFFFFFFFF),
            "FRAME_TOO_LARGE",
        ),
        fv_err(
            "frame_too_large_extension",
            "Ignorable extension types are skipped only after the MAX_FRAME_SIZE check (§12).",
            raw(0x80, 0, 0, b"", length=16_385),
            "FRAME_TOO_LARGE",
            max_frame_size=16_384,
        ),
        fv_err(
            "unknown_type_0x0d",
            "Frame type 0x0d is reserved and must be understood.",
            raw(0x0D, 0, 0, b""),
            "UNKNOWN_FRAME_TYPE",
        ),
        fv_err(
            "unknown_type_0x00",
            "Frame type 0x00.",
            raw(0x00, 0, 0, b""),
            "UNKNOWN_FRAME_TYPE",
        ),
        fv_err(
            "unknown_type_0x7f",
            "Frame type 0x7f, the last strict type.",
            raw(0x7F, 0, 1, b"xyz"),
            "UNKNOWN_FRAME_TYPE",
        ),
        fv_err(
            "ping_on_call",
            "A connection frame (PING) on a non-zero call id (§3).",
            raw(0x0A, 0, 1, b"12345678"),
            "ILLEGAL_FRAME",
        ),
        fv_err(
            "settings_on_call",
            "SETTINGS on call 1.",
            raw(0x01, 0, 1, b""),
            "ILLEGAL_FRAME",
        ),
        fv_err(
            "goaway_on_call",
            "GOAWAY on call 3.",
            raw(0x0B, 0, 3, u32(0) + u16(0) + u16(0)),
            "ILLEGAL_FRAME",
        ),
        fv_err(
            "message_on_connection",
            "A call frame (MESSAGE) on call id 0.",
            raw(0x03, 0, 0, b"hi"),
            "ILLEGAL_FRAME",
        ),
        fv_err(
            "call_on_connection",
            "CALL with call id 0.",
            raw(0x02, 1, 0, call_fixed() + u16(6) + b"/p.S/M" + u16(0)),
            "ILLEGAL_FRAME",
        ),
        fv_err(
            "call_shorter_than_fixed_fields",
            "CALL payload of 11 bytes, shorter than its 12 fixed bytes.",
            raw(0x02, 0, 1, call_fixed(1)[:11]),
            M,
        ),
        fv_err(
            "call_missing_metadata_block",
            "CALL with the fixed fields but no metadata block.",
            raw(0x02, 0, 1, call_fixed(1)),
            M,
        ),
        fv_err(
            "call_name_length_truncated",
            "NAMED CALL with one byte where the 2-byte name_len should be.",
            raw(0x02, 1, 1, call_fixed() + b"\x06"),
            M,
        ),
        fv_err(
            "call_name_truncated",
            "NAMED CALL whose name_len (10) runs past the payload.",
            raw(0x02, 1, 1, call_fixed() + u16(10) + b"/p."),
            M,
        ),
        fv_err(
            "call_empty_name",
            "NAMED CALL with an empty method name (§5.2: 1..=1024 bytes).",
            raw(0x02, 1, 1, call_fixed() + u16(0) + u16(0)),
            M,
        ),
        fv_err(
            "call_name_1025_bytes",
            "NAMED CALL with a 1025-byte method name.",
            raw(0x02, 1, 1, call_fixed() + u16(1025) + b"/" + b"m" * 1024 + u16(0)),
            M,
        ),
        fv_err(
            "call_name_not_utf8",
            "NAMED CALL whose name is not UTF-8.",
            raw(0x02, 1, 1, call_fixed() + u16(3) + b"/\xff\xfe" + u16(0)),
            M,
        ),
        fv_err(
            "call_trailing_bytes",
            "CALL with a byte left over after its metadata block.",
            raw(0x02, 1, 1, call_fixed() + u16(6) + b"/p.S/M" + u16(0) + b"\x00"),
            M,
        ),
        fv_err(
            "metadata_key_uppercase",
            "CALL metadata key with an upper-case letter (keys are 0-9 a-z - _ .).",
            raw(
                0x02,
                1,
                1,
                call_fixed() + u16(6) + b"/p.S/M" + md_raw([(b"User-Agent", b"x")]),
            ),
            M,
        ),
        fv_err(
            "metadata_key_empty",
            "HEADERS metadata entry with an empty key.",
            raw(0x05, 0, 1, md_raw([(b"", b"x")])),
            M,
        ),
        fv_err(
            "metadata_key_invalid_byte",
            "END trailer key containing '/'.",
            raw(0x07, 0, 1, u16(0) + u16(0) + md_raw([(b"a/b", b"x")])),
            M,
        ),
        fv_err(
            "metadata_text_not_utf8",
            "A text (non -bin) metadata value that is not UTF-8.",
            raw(0x05, 0, 1, md_raw([(b"name", b"caf\xe9")])),
            M,
        ),
        fv_err(
            "metadata_value_truncated",
            "Metadata entry whose value_len runs past the payload.",
            raw(0x05, 0, 1, u16(1) + u8(1) + u16(5) + b"a" + b"xy"),
            M,
        ),
        fv_err(
            "metadata_count_too_high",
            "Metadata block announcing 2 entries but holding 1.",
            raw(0x05, 0, 1, u16(2) + u8(1) + u16(1) + b"a" + b"x"),
            M,
        ),
        fv_err(
            "settings_length_not_multiple_of_6",
            "SETTINGS payload of 7 bytes.",
            raw(0x01, 0, 0, u16(1) + u32(16_384) + b"\x00"),
            M,
        ),
        fv_err(
            "settings_max_frame_size_below_minimum",
            "MAX_FRAME_SIZE 16383, below its valid range (§4).",
            raw(0x01, 0, 0, u16(1) + u32(16_383)),
            "SETTINGS_ERROR",
        ),
        fv_err(
            "settings_max_metadata_size_below_minimum",
            "MAX_METADATA_SIZE 3: below 4, the size of the smallest END status (msg_len and an "
            "empty trailer block), so no call could be ended (§4).",
            raw(0x01, 0, 0, u16(5) + u32(3)),
            "SETTINGS_ERROR",
        ),
        fv_err(
            "settings_max_frame_size_above_maximum",
            "MAX_FRAME_SIZE 2^31, above its valid range.",
            raw(0x01, 0, 0, u16(1) + u32(2**31)),
            "SETTINGS_ERROR",
        ),
        fv_err(
            "settings_max_concurrent_calls_above_maximum",
            "MAX_CONCURRENT_CALLS 2^31.",
            raw(0x01, 0, 0, u16(2) + u32(2**31)),
            "SETTINGS_ERROR",
        ),
        fv_err(
            "settings_initial_call_window_above_maximum",
            "INITIAL_CALL_WINDOW 0xffffffff.",
            raw(0x01, 0, 0, u16(3) + u32(0xFFFFFFFF)),
            "SETTINGS_ERROR",
        ),
        fv_err(
            "message_split_shorter_than_total_len_field",
            "MESSAGE with SPLIT and a 3-byte payload: no room for total_len.",
            raw(0x03, 0x02, 1, b"\x05\x00\x00"),
            M,
        ),
        fv_err(
            "headers_trailing_bytes",
            "HEADERS with a byte after its metadata block.",
            raw(0x05, 0, 1, u16(0) + b"\x00"),
            M,
        ),
        fv_err(
            "headers_empty_payload",
            "HEADERS with no payload at all (no metadata count).",
            raw(0x05, 0, 1, b""),
            M,
        ),
        fv_err(
            "half_close_not_empty",
            "HALF_CLOSE with a 1-byte payload.",
            raw(0x06, 0, 1, b"\x00"),
            M,
        ),
        fv_err(
            "end_shorter_than_code",
            "END with a 1-byte payload.",
            raw(0x07, 0, 1, b"\x00"),
            M,
        ),
        fv_err(
            "end_missing_trailers",
            "END with code and message but no trailers block.",
            raw(0x07, 0, 1, u16(0) + u16(2) + b"ok"),
            M,
        ),
        fv_err(
            "end_message_not_utf8",
            "END whose status message is not UTF-8.",
            raw(0x07, 0, 1, u16(13) + u16(2) + b"\xc3\x28" + u16(0)),
            M,
        ),
        fv_err(
            "cancel_wrong_length",
            "CANCEL with a 3-byte payload.",
            raw(0x08, 0, 1, b"\x01\x00\x00"),
            M,
        ),
        fv_err(
            "credit_zero", "CREDIT with increment 0 (§5.8).", raw(0x09, 0, 1, u32(0)), M
        ),
        fv_err(
            "credit_wrong_length",
            "CREDIT with a 5-byte payload.",
            raw(0x09, 0, 1, u32(1) + b"\x00"),
            M,
        ),
        fv_err(
            "ping_7_bytes",
            "PING with 7 bytes of data (§5.9: exactly 8).",
            raw(0x0A, 0, 0, b"1234567"),
            M,
        ),
        fv_err(
            "ping_9_bytes",
            "PING with 9 bytes of data.",
            raw(0x0A, 1, 0, b"123456789"),
            M,
        ),
        fv_err(
            "goaway_short",
            "GOAWAY with a 5-byte payload.",
            raw(0x0B, 0, 0, b"\x01\x00\x00\x00\x00"),
            M,
        ),
        fv_err(
            "goaway_reason_truncated",
            "GOAWAY whose reason_len runs past the payload.",
            raw(0x0B, 0, 0, u32(1) + u16(0) + u16(9) + b"bye"),
            M,
        ),
        fv_err(
            "goaway_reason_not_utf8",
            "GOAWAY whose reason is not UTF-8.",
            raw(0x0B, 0, 0, u32(1) + u16(0) + u16(1) + b"\x80"),
            M,
        ),
        fv_err(
            "error_short",
            "ERROR with a 3-byte payload.",
            raw(0x0C, 0, 0, b"\x06\x00\x01"),
            M,
        ),
        fv_err(
            "error_trailing_bytes",
            "ERROR with a byte after its reason.",
            raw(0x0C, 0, 0, u16(6) + u16(2) + b"no" + b"!"),
            M,
        ),
    ]


# --- session vectors -----------------------------------------------------------------------------


def recv(*parts) -> dict:
    return {"recv_hex": hexval(wire(*parts))}


def cmd(name, **kw) -> dict:
    out = {"command": name}
    for k, val in kw.items():
        out[k] = hexval(val) if k.endswith("_hex") else val
    return out


def ev(ty, **kw) -> dict:
    out = {"type": ty}
    for k, val in kw.items():
        out[k] = hexval(val) if k.endswith("_hex") else val
    return out


def events(*evs, unordered=False) -> dict:
    out = {"expect_events": list(evs)}
    if unordered:
        out["unordered"] = True
    return out


def sent(*frames, include_credit=False) -> dict:
    out = {"expect_sent": [f.fields if isinstance(f, Frame) else f for f in frames]}
    if include_credit:
        out["include_credit"] = True
    return out


def expect_error(code) -> dict:
    assert code in ERROR_CODES, code
    return {"expect_error": code}


def session(
    name, description, role, steps, local_settings=None, local_limits=None
) -> dict:
    v = {"name": name, "description": description, "kind": "session", "role": role}
    if local_settings:
        v["local_settings"] = local_settings
    if local_limits:
        v["local_limits"] = local_limits
    v["steps"] = steps
    return v


ESTABLISHED = events(ev("Established"))


def server_hello_steps(client_settings=()) -> list:
    return [recv(PREFACE, settings(list(client_settings))), ESTABLISHED]


def client_hello_steps(server_settings=()) -> list:
    return [recv(PREFACE, settings(list(server_settings))), ESTABLISHED]


def started(call_id, method, *, codec=0, timeout_us=0, metadata=()) -> dict:
    return ev(
        "CallStarted",
        call_id=call_id,
        method=method,
        codec=codec,
        timeout_us=timeout_us,
        metadata=md_json(list(metadata)),
    )


# The worked examples of protocol.md §13: the same bytes feed the server-role and client-role
# vectors and docs/protocol-examples.md.

UNARY_METHOD = "/helloworld.Greeter/SayHello"
UNARY_MD = [("user-agent", "topspin-python/0.1")]
UNARY_REQ = b"\x0a\x05world"  # protobuf HelloRequest { name: "world" }
UNARY_RESP = b"\x0a\x0bHello world"  # protobuf HelloReply { message: "Hello world" }
UNARY_CLIENT_SETTINGS = settings([(4, 4 * 1024 * 1024)])
UNARY_SERVER_SETTINGS = settings(
    [(1, 16_777_216), (2, 100), (3, 1_048_576), (4, 67_108_864), (5, 16_384)]
)
UNARY_CALL = call(1, 1, UNARY_METHOD, codec=0, timeout_us=2_000_000, metadata=UNARY_MD)
UNARY_MSG = message(1, UNARY_REQ, end_stream=True)
UNARY_HEADERS = headers(1)
UNARY_REPLY = message(1, UNARY_RESP)
UNARY_END = end(1, "OK")

BIDI_METHOD = "/chat.Chat/Talk"
BIDI_CALL = call(1, 0, BIDI_METHOD, codec=1)
BIDI_M1 = message(1, b"hi")
BIDI_R1 = message(1, b"HI")
BIDI_M2 = message(1, b"bye")
BIDI_R2 = message(1, b"BYE")
BIDI_HC = half_close(1)
BIDI_END = end(1, "OK", "", [("messages", "2")])


def unary_conversation() -> list:
    return [
        ("client → server", "the preface", None),
        (
            "client → server",
            "SETTINGS: MAX_MESSAGE_SIZE 4 MiB, the rest default",
            UNARY_CLIENT_SETTINGS,
        ),
        ("server → client", "the preface", None),
        (
            "server → client",
            "SETTINGS: all five, MAX_CONCURRENT_CALLS 100",
            UNARY_SERVER_SETTINGS,
        ),
        (
            "client → server",
            "CALL 1: names the method and binds it to method_id 1, 2 s deadline, one metadata entry",
            UNARY_CALL,
        ),
        (
            "client → server",
            "MESSAGE with END_STREAM: the request, and the client's half-close",
            UNARY_MSG,
        ),
        ("server → client", "HEADERS: empty response headers", UNARY_HEADERS),
        ("server → client", "MESSAGE: the reply", UNARY_REPLY),
        ("server → client", "END: status OK, no message, no trailers", UNARY_END),
    ]


def bidi_conversation() -> list:
    return [
        ("client → server", "the preface", None),
        (
            "client → server",
            "SETTINGS: empty, every setting at its default",
            settings([]),
        ),
        ("server → client", "the preface", None),
        (
            "server → client",
            "SETTINGS: empty, every setting at its default",
            settings([]),
        ),
        (
            "client → server",
            "CALL 1: named for this call only (method_id 0), raw codec",
            BIDI_CALL,
        ),
        ("client → server", "MESSAGE 'hi'", BIDI_M1),
        (
            "server → client",
            "MESSAGE 'HI' (no HEADERS: empty response headers)",
            BIDI_R1,
        ),
        ("client → server", "MESSAGE 'bye'", BIDI_M2),
        ("server → client", "MESSAGE 'BYE'", BIDI_R2),
        ("client → server", "HALF_CLOSE: the client sends no more", BIDI_HC),
        ("server → client", "END: OK with one trailer", BIDI_END),
    ]


def sessions_valid() -> list:
    v = []
    v.append(
        session(
            "worked_unary",
            "protocol.md §13 worked example 1, server side: one unary call (see "
            "docs/protocol-examples.md for the bytes annotated).",
            "server",
            [
                recv(PREFACE, UNARY_CLIENT_SETTINGS),
                ESTABLISHED,
                recv(UNARY_CALL, UNARY_MSG),
                events(
                    started(1, UNARY_METHOD, timeout_us=2_000_000, metadata=UNARY_MD),
                    ev("Message", call_id=1, message_hex=UNARY_REQ),
                    ev("HalfClosed", call_id=1),
                ),
                cmd("send_headers", call_id=1, metadata=[]),
                cmd(
                    "send_message", call_id=1, message_hex=UNARY_RESP, end_stream=False
                ),
                cmd("end_call", call_id=1, code="OK", message="", trailers=[]),
                sent(UNARY_HEADERS, UNARY_REPLY, UNARY_END),
                events(),
            ],
        )
    )
    v.append(
        session(
            "worked_unary_client",
            "protocol.md §13 worked example 1, client side. The client's CALL is checked without "
            "method_id (whether to intern is the client's choice).",
            "client",
            [
                recv(PREFACE, UNARY_SERVER_SETTINGS),
                ESTABLISHED,
                cmd(
                    "start_call",
                    method=UNARY_METHOD,
                    codec=0,
                    timeout_us=2_000_000,
                    metadata=md_json(UNARY_MD),
                    call_id=1,
                ),
                cmd("send_message", call_id=1, message_hex=UNARY_REQ, end_stream=True),
                sent(
                    {
                        "type": "CALL",
                        "call_id": 1,
                        "method_name": UNARY_METHOD,
                        "codec": 0,
                        "timeout_us": 2_000_000,
                        "metadata": md_json(UNARY_MD),
                    },
                    UNARY_MSG,
                ),
                recv(UNARY_HEADERS, UNARY_REPLY, UNARY_END),
                events(
                    ev("Headers", call_id=1, metadata=[]),
                    ev("Message", call_id=1, message_hex=UNARY_RESP),
                    ev("Ended", call_id=1, code="OK", message="", trailers=[]),
                ),
            ],
        )
    )
    v.append(
        session(
            "worked_bidi",
            "protocol.md §13 worked example 2, server side: a bidirectional stream, two messages "
            "each way, HALF_CLOSE, END with a trailer.",
            "server",
            [
                recv(PREFACE, settings([])),
                ESTABLISHED,
                recv(BIDI_CALL, BIDI_M1),
                events(
                    started(1, BIDI_METHOD, codec=1),
                    ev("Message", call_id=1, message_hex=b"hi"),
                ),
                cmd("send_message", call_id=1, message_hex=b"HI", end_stream=False),
                sent(BIDI_R1),
                recv(BIDI_M2),
                events(ev("Message", call_id=1, message_hex=b"bye")),
                cmd("send_message", call_id=1, message_hex=b"BYE", end_stream=False),
                sent(BIDI_R2),
                recv(BIDI_HC),
                events(ev("HalfClosed", call_id=1)),
                cmd(
                    "end_call",
                    call_id=1,
                    code="OK",
                    message="",
                    trailers=md_json([("messages", "2")]),
                ),
                sent(BIDI_END),
                events(),
            ],
        )
    )
    v.append(
        session(
            "worked_bidi_client",
            "protocol.md §13 worked example 2, client side.",
            "client",
            [
                recv(PREFACE, settings([])),
                ESTABLISHED,
                cmd(
                    "start_call",
                    method=BIDI_METHOD,
                    codec=1,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                cmd("send_message", call_id=1, message_hex=b"hi", end_stream=False),
                sent(
                    {
                        "type": "CALL",
                        "call_id": 1,
                        "method_name": BIDI_METHOD,
                        "codec": 1,
                        "timeout_us": 0,
                        "metadata": [],
                    },
                    BIDI_M1,
                ),
                recv(BIDI_R1),
                events(ev("Message", call_id=1, message_hex=b"HI")),
                cmd("send_message", call_id=1, message_hex=b"bye", end_stream=False),
                cmd("half_close", call_id=1),
                sent(BIDI_M2, BIDI_HC),
                recv(BIDI_R2, BIDI_END),
                events(
                    ev("Message", call_id=1, message_hex=b"BYE"),
                    ev(
                        "Ended",
                        call_id=1,
                        code="OK",
                        message="",
                        trailers=md_json([("messages", "2")]),
                    ),
                ),
            ],
        )
    )
    def call_sent(call_id, method):
        return {
            "type": "CALL",
            "call_id": call_id,
            "method_name": method,
            "codec": 1,
            "timeout_us": 0,
            "metadata": [],
        }

    v.append(
        session(
            "client_answers_without_headers",
            "A server that sends no HEADERS: its first MESSAGE (on call 1, a bidirectional call "
            "the client has sent nothing on yet) or its END (call 2) comes first, and the client "
            "reports no Headers event — the application sees empty response headers (§5.4). A "
            "client hands the application its call before any of it arrives (§6).",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/feed.Feed/Chat",
                    codec=1,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                cmd(
                    "start_call",
                    method="/feed.Feed/Watch",
                    codec=1,
                    timeout_us=0,
                    metadata=[],
                    call_id=2,
                ),
                cmd("send_message", call_id=2, message_hex=b"w", end_stream=True),
                sent(
                    call_sent(1, "/feed.Feed/Chat"),
                    call_sent(2, "/feed.Feed/Watch"),
                    message(2, b"w", end_stream=True),
                ),
                recv(message(1, b"welcome"), end(2, "OK")),
                events(
                    ev("Message", call_id=1, message_hex=b"welcome"),
                    ev("Ended", call_id=2, code="OK", message="", trailers=[]),
                ),
                cmd("send_message", call_id=1, message_hex=b"hi", end_stream=False),
                cmd("half_close", call_id=1),
                sent(message(1, b"hi"), half_close(1)),
                recv(message(1, b"HI"), end(1, "OK")),
                events(
                    ev("Message", call_id=1, message_hex=b"HI"),
                    ev("Ended", call_id=1, code="OK", message="", trailers=[]),
                ),
            ],
        )
    )
    v.append(
        session(
            "server_interned_method",
            "A method bound to id 1 by one CALL is used by id alone in the next (§5.2).",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 1, "/kv.Store/Get"), message(1, b"k1", end_stream=True)),
                recv(call(2, 1, None), half_close(2)),
                events(
                    started(1, "/kv.Store/Get"),
                    ev("Message", call_id=1, message_hex=b"k1"),
                    ev("HalfClosed", call_id=1),
                    started(2, "/kv.Store/Get"),
                    ev("HalfClosed", call_id=2),
                ),
            ],
        )
    )
    v.append(
        session(
            "server_gaps_in_call_ids",
            "Call ids need not be consecutive; a call frame for an unused id below the highest "
            "(here 3, after calls 1 and 5) is ignored like one for a call that ended (§6).",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), call(5, 0, "/p.S/M")),
                events(started(1, "/p.S/M"), started(5, "/p.S/M")),
                recv(message(3, b"lost"), half_close(3), credit(3, 100)),
                events(),
                sent(),
                recv(message(5, b"ok")),
                events(ev("Message", call_id=5, message_hex=b"ok")),
            ],
        )
    )
    v.append(
        session(
            "server_split_message_interleaved",
            "A 10-byte message in four frames (SPLIT first chunk, CONTINUATIONs including an "
            "empty one), with a whole message of another call between them (§5.3).",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/A"), call(2, 0, "/p.S/B")),
                events(started(1, "/p.S/A"), started(2, "/p.S/B")),
                recv(message(1, b"012", total_len=10), continuation(1, b"3456")),
                events(),
                recv(
                    message(2, b"other"), continuation(1, b""), continuation(1, b"789")
                ),
                events(
                    ev("Message", call_id=2, message_hex=b"other"),
                    ev("Message", call_id=1, message_hex=b"0123456789"),
                ),
            ],
        )
    )
    v.append(
        session(
            "server_split_message_end_stream",
            "A split message with END_STREAM: the client half-closes once it is complete.",
            "server",
            server_hello_steps()
            + [
                recv(
                    call(1, 0, "/p.S/M"),
                    message(1, b"ab", total_len=4, end_stream=True),
                ),
                events(started(1, "/p.S/M")),
                recv(continuation(1, b"cd")),
                events(
                    ev("Message", call_id=1, message_hex=b"abcd"),
                    ev("HalfClosed", call_id=1),
                ),
            ],
        )
    )
    v.append(
        session(
            "server_max_frame_size_payload",
            "With MAX_FRAME_SIZE at its minimum, 16384, a frame with a 16384-byte payload is "
            "accepted.",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), message(1, b"\xab" * 16_384)),
                events(
                    started(1, "/p.S/M"),
                    ev("Message", call_id=1, message_hex=b"\xab" * 16_384),
                ),
            ],
            local_settings={"MAX_FRAME_SIZE": 16_384},
        )
    )
    c = call(1, 0, "/p.S/M", metadata=[("k", "v")]).bytes
    v.append(
        session(
            "server_partial_input",
            "Bytes arrive in pieces: the preface split, a frame header split, a payload split. "
            "Nothing happens until a frame is complete.",
            "server",
            [
                recv(PREFACE[:3]),
                events(),
                recv(PREFACE[3:], settings([]).bytes[:5]),
                events(),
                recv(settings([]).bytes[5:], c[:7]),
                ESTABLISHED,
                recv(c[7:20]),
                events(),
                recv(c[20:]),
                events(started(1, "/p.S/M", metadata=[("k", "v")])),
            ],
        )
    )
    v.append(
        session(
            "server_ping",
            "A PING is answered with a PING ACK with the same data; the answer to our own PING "
            "is reported as Pong (§5.9).",
            "server",
            server_hello_steps()
            + [
                recv(ping(b"\x00\x01\x02\x03\x04\x05\x06\x07")),
                sent(ping(b"\x00\x01\x02\x03\x04\x05\x06\x07", ack=True)),
                events(),
                cmd("ping", data_hex=b"pingpong"),
                sent(ping(b"pingpong")),
                recv(ping(b"pingpong", ack=True)),
                events(ev("Pong", data_hex=b"pingpong")),
                sent(),
            ],
        )
    )
    v.append(
        session(
            "server_extension_frames_ignored",
            "Ignorable extension frames (0x80 on call 0, 0xff on an open call) are skipped (§12).",
            "server",
            server_hello_steps()
            + [
                recv(extension(0x80, 0, 0, b"future"), call(1, 0, "/p.S/M")),
                events(started(1, "/p.S/M")),
                recv(extension(0xFF, 0x03, 1, b"\x00" * 10), message(1, b"x")),
                events(ev("Message", call_id=1, message_hex=b"x")),
                sent(),
            ],
        )
    )
    # Every frame fits the receiver's MAX_FRAME_SIZE (§9): with the smallest frame limit and a
    # metadata limit as large, the status size a server may send is 2 less than the frame limit.
    small_limits = [(1, 16_384), (5, 16_384)]

    def trailer_block(size: int) -> list:
        entries = [("k", "v" * (size - md_size([("k", "")])))]
        assert md_size(entries) == size
        return entries

    v.append(
        session(
            "server_end_status_fits_the_clients_frame_limit",
            "The client allows 16,384-byte frames and 16,384 bytes of status: an END whose status "
            "size (msg_len + message + trailers) is 16,382 is a 16,384-byte frame and goes as is "
            "(§9).",
            "server",
            server_hello_steps(small_limits)
            + [
                recv(call(1, 0, "/p.S/M")),
                events(started(1, "/p.S/M")),
                cmd(
                    "end_call",
                    call_id=1,
                    code="NOT_FOUND",
                    message="",
                    trailers=md_json(trailer_block(16_380)),
                ),
                sent(end(1, "NOT_FOUND", "", trailer_block(16_380))),
            ],
        )
    )
    v.append(
        session(
            "server_end_status_over_the_clients_frame_limit",
            "The client allows 16,384-byte frames and 16,384 bytes of status: an END whose status "
            "size is 16,384 is within MAX_METADATA_SIZE but would be a 16,386-byte frame, so the "
            "server treats it as over the limit: it keeps the code, drops the trailers and "
            "truncates the message (here empty) (§5.6, §9).",
            "server",
            server_hello_steps(small_limits)
            + [
                recv(call(1, 0, "/p.S/M")),
                events(started(1, "/p.S/M")),
                cmd(
                    "end_call",
                    call_id=1,
                    code="NOT_FOUND",
                    message="",
                    trailers=md_json(trailer_block(16_382)),
                ),
                sent(end(1, "NOT_FOUND", "")),
            ],
        )
    )
    v.append(
        session(
            "server_frames_after_end_ignored",
            "After the server's END, call frames of the client that crossed it are ignored (§6), "
            "and the connection goes on.",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M")),
                events(started(1, "/p.S/M")),
                cmd(
                    "end_call",
                    call_id=1,
                    code="PERMISSION_DENIED",
                    message="no",
                    trailers=[],
                ),
                sent(end(1, "PERMISSION_DENIED", "no")),
                recv(
                    message(1, b"abc"),
                    message(1, b"abc", total_len=9),
                    continuation(1, b"def"),
                    credit(1, 1000),
                    half_close(1),
                    cancel(1, "CANCELLED"),
                ),
                events(),
                sent(include_credit=True),
                recv(call(2, 0, "/p.S/M")),
                events(started(2, "/p.S/M")),
            ],
        )
    )
    v.append(
        session(
            "server_client_cancels",
            "CANCEL closes the call at once: the server reports Cancelled; frames that cross it "
            "are ignored (§5.7).",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), message(1, b"a"), cancel(1, "CANCELLED")),
                events(
                    started(1, "/p.S/M"),
                    ev("Message", call_id=1, message_hex=b"a"),
                    ev("Cancelled", call_id=1, code="CANCELLED"),
                ),
                recv(message(1, b"b"), half_close(1)),
                events(),
                sent(),
            ],
        )
    )
    v.append(
        session(
            "server_half_close_without_message",
            "A client-streaming call with no message at all: CALL then HALF_CLOSE.",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), half_close(1)),
                events(started(1, "/p.S/M"), ev("HalfClosed", call_id=1)),
                cmd("end_call", call_id=1, code="OK", message="", trailers=[]),
                sent(end(1)),
            ],
        )
    )
    big_md = [("padding", "x" * 90)]  # block size 2 + 3 + 7 + 90 = 102 > 64
    exact_md = [("padding", "x" * 52)]  # block size 64 = the limit
    assert md_size(big_md) == 102 and md_size(exact_md) == 64
    v.append(
        session(
            "server_metadata_too_large",
            "CALL metadata over the server's MAX_METADATA_SIZE (102 > 64 bytes): call error, END "
            "RESOURCE_EXHAUSTED without starting the call; the method binding still takes effect "
            "(§9); the MESSAGE that followed the CALL is ignored; a block of exactly 64 bytes is "
            "accepted.",
            "server",
            server_hello_steps()
            + [
                recv(
                    call(1, 1, "/p.S/Big", metadata=big_md),
                    message(1, b"req", end_stream=True),
                ),
                events(),
                sent({"type": "END", "call_id": 1, "code": "RESOURCE_EXHAUSTED"}),
                recv(call(3, 1, None, metadata=exact_md)),
                events(started(3, "/p.S/Big", metadata=exact_md)),
                sent(),
            ],
            local_settings={"MAX_METADATA_SIZE": 64},
        )
    )
    v.append(
        session(
            "server_message_too_large",
            "Messages over the server's MAX_MESSAGE_SIZE (16): a 16-byte one is accepted, a "
            "17-byte one ends the call with END RESOURCE_EXHAUSTED; a split one is refused from "
            "its total_len and its CONTINUATION ignored; the connection goes on (§5.3, §9).",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), message(1, b"0123456789abcdef")),
                events(
                    started(1, "/p.S/M"),
                    ev("Message", call_id=1, message_hex=b"0123456789abcdef"),
                ),
                recv(message(1, b"0123456789abcdefg")),
                sent({"type": "END", "call_id": 1, "code": "RESOURCE_EXHAUSTED"}),
                events(ev("Cancelled", call_id=1, code="RESOURCE_EXHAUSTED")),
                recv(call(2, 0, "/p.S/M"), message(2, b"01234567", total_len=100)),
                sent({"type": "END", "call_id": 2, "code": "RESOURCE_EXHAUSTED"}),
                events(
                    started(2, "/p.S/M"),
                    ev("Cancelled", call_id=2, code="RESOURCE_EXHAUSTED"),
                ),
                recv(
                    continuation(2, b"\x00" * 92),
                    call(3, 0, "/p.S/M"),
                    message(3, b"fine"),
                ),
                events(
                    started(3, "/p.S/M"), ev("Message", call_id=3, message_hex=b"fine")
                ),
                sent(),
            ],
            local_settings={"MAX_MESSAGE_SIZE": 16},
        )
    )
    v.append(
        session(
            "server_too_many_concurrent_calls",
            "MAX_CONCURRENT_CALLS 1: a second open call is refused with END RESOURCE_EXHAUSTED "
            "and never started; once the first has ended a new call is accepted (§9).",
            "server",
            server_hello_steps()
            + [
                recv(
                    call(1, 0, "/p.S/M"), call(2, 0, "/p.S/M"), message(2, b"ignored")
                ),
                events(started(1, "/p.S/M")),
                sent({"type": "END", "call_id": 2, "code": "RESOURCE_EXHAUSTED"}),
                cmd("end_call", call_id=1, code="OK", message="", trailers=[]),
                sent(end(1)),
                recv(call(3, 0, "/p.S/M")),
                events(started(3, "/p.S/M")),
                sent(),
            ],
            local_settings={"MAX_CONCURRENT_CALLS": 1},
        )
    )
    v.append(
        session(
            "server_max_concurrent_calls_zero",
            "MAX_CONCURRENT_CALLS 0 means no new calls: every CALL is refused with END "
            "RESOURCE_EXHAUSTED.",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), call(2, 0, "/p.S/M")),
                events(),
                sent(
                    {"type": "END", "call_id": 1, "code": "RESOURCE_EXHAUSTED"},
                    {"type": "END", "call_id": 2, "code": "RESOURCE_EXHAUSTED"},
                ),
            ],
            local_settings={"MAX_CONCURRENT_CALLS": 0},
        )
    )
    v.append(
        session(
            "server_overdraft_then_credit",
            "INITIAL_CALL_WINDOW 100: a 200-byte message (cost 212) may go out while credit is "
            "positive, leaving -112 (the overdraft rule, §7); after the server grants 200 the "
            "credit is 88 and the next message is accepted.",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), message(1, b"\x01" * 200)),
                events(
                    started(1, "/p.S/M"),
                    ev("Message", call_id=1, message_hex=b"\x01" * 200),
                ),
                cmd("grant_credit", call_id=1, increment=200),
                sent(credit(1, 200), include_credit=True),
                recv(message(1, b"\x02" * 50)),
                events(ev("Message", call_id=1, message_hex=b"\x02" * 50)),
            ],
            local_settings={"INITIAL_CALL_WINDOW": 100},
        )
    )
    v.append(
        session(
            "server_send_waits_for_credit",
            "The client's INITIAL_CALL_WINDOW is 0: the server may not send a message (send "
            "credit is not > 0) until the client's CREDIT arrives (§7).",
            "server",
            server_hello_steps([(3, 0)])
            + [
                recv(call(1, 0, "/p.S/M")),
                events(started(1, "/p.S/M")),
                cmd(
                    "send_message",
                    call_id=1,
                    message_hex=b"reply",
                    end_stream=False,
                    blocked=True,
                ),
                sent(),
                recv(credit(1, 10)),
                cmd("send_message", call_id=1, message_hex=b"reply", end_stream=False),
                sent(message(1, b"reply")),
            ],
        )
    )
    v.append(
        session(
            "server_goaway",
            "The server goes away: GOAWAY carries the highest call id received; a later CALL "
            "above it is not processed and gets no answer; call 1 finishes (§8.3).",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M")),
                events(started(1, "/p.S/M")),
                cmd("go_away", code="NO_ERROR", reason="restarting"),
                sent(goaway(1, "NO_ERROR", "restarting")),
                recv(call(2, 0, "/p.S/M")),
                events(),
                sent(),
                recv(message(1, b"last", end_stream=True)),
                events(
                    ev("Message", call_id=1, message_hex=b"last"),
                    ev("HalfClosed", call_id=1),
                ),
                cmd("end_call", call_id=1, code="OK", message="", trailers=[]),
                sent(end(1)),
            ],
        )
    )
    v.append(
        session(
            "server_receives_goaway",
            "The client goes away (GOAWAY with its highest call id); its open call goes on.",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), goaway(1, "NO_ERROR", "client done")),
                events(
                    started(1, "/p.S/M"),
                    ev("GoAway", last_call_id=1, code="NO_ERROR", reason="client done"),
                ),
                recv(message(1, b"x", end_stream=True)),
                events(
                    ev("Message", call_id=1, message_hex=b"x"),
                    ev("HalfClosed", call_id=1),
                ),
            ],
        )
    )
    v.append(
        session(
            "server_peer_settings_unknown_and_repeated",
            "The client's SETTINGS has an unknown id and a repeated one: the connection is "
            "established as usual.",
            "server",
            server_hello_steps([(0x77, 1), (4, 10), (4, 1_000_000)])
            + [recv(call(1, 0, "/p.S/M")), events(started(1, "/p.S/M"))],
        )
    )
    # client role
    v.append(
        session(
            "client_frames_after_end_ignored",
            "After END, server frames on the ended call are ignored (§6).",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                recv(end(1, "UNAVAILABLE", "busy")),
                events(
                    ev(
                        "Ended",
                        call_id=1,
                        code="UNAVAILABLE",
                        message="busy",
                        trailers=[],
                    )
                ),
                recv(headers(1), message(1, b"late"), credit(1, 5), end(1)),
                events(),
            ],
        )
    )
    v.append(
        session(
            "client_unknown_status_code",
            "END with status code 99 is reported as UNKNOWN with its message (§11).",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                recv(raw(0x07, 0, 1, u16(99) + u16(4) + b"huh?" + u16(0))),
                events(
                    ev("Ended", call_id=1, code="UNKNOWN", message="huh?", trailers=[])
                ),
            ],
        )
    )
    v.append(
        session(
            "client_split_message",
            "The server sends a message in a SPLIT MESSAGE and two CONTINUATIONs.",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                recv(
                    headers(1, [("a", "b")]),
                    message(1, b"hel", total_len=11),
                    continuation(1, b"lo "),
                ),
                events(ev("Headers", call_id=1, metadata=md_json([("a", "b")]))),
                recv(continuation(1, b"world"), end(1)),
                events(
                    ev("Message", call_id=1, message_hex=b"hello world"),
                    ev("Ended", call_id=1, code="OK", message="", trailers=[]),
                ),
            ],
        )
    )
    v.append(
        session(
            "client_message_too_large",
            "A server message over the client's MAX_MESSAGE_SIZE (16): the client sends CANCEL "
            "RESOURCE_EXHAUSTED and reports RESOURCE_EXHAUSTED; the END that crosses it is "
            "ignored (§9).",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                recv(headers(1), message(1, b"0123456789abcdefg")),
                sent({"type": "CALL", "call_id": 1}, cancel(1, "RESOURCE_EXHAUSTED")),
                events(
                    ev("Headers", call_id=1, metadata=[]),
                    ev("Ended", call_id=1, code="RESOURCE_EXHAUSTED"),
                ),
                recv(end(1)),
                events(),
            ],
            local_settings={"MAX_MESSAGE_SIZE": 16},
        )
    )
    v.append(
        session(
            "client_headers_too_large",
            "HEADERS over the client's MAX_METADATA_SIZE (102 > 64): CANCEL RESOURCE_EXHAUSTED "
            "and RESOURCE_EXHAUSTED reported (§9).",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                recv(headers(1, big_md)),
                sent({"type": "CALL", "call_id": 1}, cancel(1, "RESOURCE_EXHAUSTED")),
                events(ev("Ended", call_id=1, code="RESOURCE_EXHAUSTED")),
            ],
            local_settings={"MAX_METADATA_SIZE": 64},
        )
    )
    v.append(
        session(
            "client_end_trailers_too_large",
            "END whose message + trailers exceed the client's MAX_METADATA_SIZE (4 + 102 > 64): "
            "the call ends but the client reports RESOURCE_EXHAUSTED instead of the status, and "
            "sends nothing (§5.6).",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                sent({"type": "CALL", "call_id": 1}),
                recv(end(1, "OK", "done", big_md)),
                events(ev("Ended", call_id=1, code="RESOURCE_EXHAUSTED")),
                sent(),
            ],
            local_settings={"MAX_METADATA_SIZE": 64},
        )
    )
    v.append(
        session(
            "client_goaway",
            "GOAWAY with last_call_id 1 while calls 1 and 2 are open: call 2 fails with "
            "UNAVAILABLE, call 1 goes on to its END (§8.3).",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=2,
                ),
                sent({"type": "CALL", "call_id": 1}, {"type": "CALL", "call_id": 2}),
                recv(goaway(1, "NO_ERROR", "bye")),
                events(
                    ev("GoAway", last_call_id=1, code="NO_ERROR", reason="bye"),
                    ev("Ended", call_id=2, code="UNAVAILABLE"),
                    unordered=True,
                ),
                recv(end(1)),
                events(ev("Ended", call_id=1, code="OK", message="", trailers=[])),
            ],
        )
    )
    v.append(
        session(
            "client_cancel",
            "The client cancels: CANCEL CANCELLED goes out; server frames that cross it are "
            "ignored (§5.7).",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                cmd("cancel", call_id=1, code="CANCELLED"),
                sent({"type": "CALL", "call_id": 1}, cancel(1, "CANCELLED")),
                recv(headers(1), message(1, b"late"), end(1)),
                events(),
            ],
        )
    )
    v.append(
        session(
            "client_ping",
            "The client answers a PING with a PING ACK.",
            "client",
            client_hello_steps()
            + [recv(ping(b"\xff" * 8)), sent(ping(b"\xff" * 8, ack=True)), events()],
        )
    )
    v.append(
        session(
            "client_waits_for_credit",
            "The server's INITIAL_CALL_WINDOW is 0: the CALL goes out but the message waits for "
            "the server's CREDIT (§7).",
            "client",
            client_hello_steps([(3, 0)])
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                cmd(
                    "send_message",
                    call_id=1,
                    message_hex=b"req",
                    end_stream=True,
                    blocked=True,
                ),
                sent({"type": "CALL", "call_id": 1}),
                recv(credit(1, 15)),
                cmd("send_message", call_id=1, message_hex=b"req", end_stream=True),
                sent(message(1, b"req", end_stream=True)),
            ],
        )
    )
    v.append(
        session(
            "client_sequential_call_ids",
            "Call ids grow: the client's calls are 1, 2, 3 (README: vectors assume consecutive "
            "ids from 1), and the server answers them out of order.",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/A",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                cmd(
                    "start_call",
                    method="/p.S/B",
                    codec=2,
                    timeout_us=5_000,
                    metadata=[],
                    call_id=2,
                ),
                cmd(
                    "start_call",
                    method="/p.S/A",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=3,
                ),
                sent(
                    {"type": "CALL", "call_id": 1, "method_name": "/p.S/A"},
                    {
                        "type": "CALL",
                        "call_id": 2,
                        "method_name": "/p.S/B",
                        "codec": 2,
                        "timeout_us": 5_000,
                    },
                    {"type": "CALL", "call_id": 3},
                ),
                recv(end(3, "NOT_FOUND"), end(1, "OK"), end(2, "ABORTED", "conflict")),
                events(
                    ev("Ended", call_id=3, code="NOT_FOUND", message="", trailers=[]),
                    ev("Ended", call_id=1, code="OK", message="", trailers=[]),
                    ev(
                        "Ended",
                        call_id=2,
                        code="ABORTED",
                        message="conflict",
                        trailers=[],
                    ),
                ),
            ],
        )
    )

    # --- decisions of the hostile-peers issue (spec-review rows) ---------------------------------
    v.append(
        session(
            "server_zero_window_grants_first_credit",
            "The server's INITIAL_CALL_WINDOW is 0: a sender without credit waits, so the "
            "receiver grants the first credit itself when the call starts (§7): CREDIT 1, enough "
            "for one frame of any size. The client's MESSAGE then goes.",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M")),
                events(started(1, "/p.S/M")),
                sent(credit(1, 1), include_credit=True),
                recv(message(1, b"hi", end_stream=True)),
                events(
                    ev("Message", call_id=1, message_hex=b"hi"),
                    ev("HalfClosed", call_id=1),
                ),
            ],
            local_settings={"INITIAL_CALL_WINDOW": 0},
        )
    )
    v.append(
        session(
            "client_zero_window_grants_first_credit",
            "The client's INITIAL_CALL_WINDOW is 0: it grants the first credit with its CALL "
            "(§7), so the server's reply can go.",
            "client",
            client_hello_steps()
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    call_id=1,
                ),
                sent({"type": "CALL", "call_id": 1}, credit(1, 1), include_credit=True),
                recv(message(1, b"reply")),
                events(ev("Message", call_id=1, message_hex=b"reply")),
            ],
            local_settings={"INITIAL_CALL_WINDOW": 0},
        )
    )
    v.append(
        session(
            "server_end_message_truncated_at_char_boundary",
            "The client allows 9 bytes of status: an END with message 'ééé' (6 bytes) and a "
            "trailer does not fit, so the server keeps the code, drops the trailers and truncates "
            "the message at a UTF-8 boundary: 5 bytes of room hold 'éé' (4 bytes) (§5.6).",
            "server",
            server_hello_steps([(5, 9)])
            + [
                recv(call(1, 0, "/p.S/M")),
                events(started(1, "/p.S/M")),
                cmd(
                    "end_call",
                    call_id=1,
                    code="NOT_FOUND",
                    message="ééé",
                    trailers=md_json([("k", "v")]),
                ),
                sent(end(1, "NOT_FOUND", "éé")),
            ],
        )
    )
    v.append(
        session(
            "server_cancel_unknown_code",
            "CANCEL with code 99: any code is accepted; codes above 16 are reported as UNKNOWN "
            "(§5.7).",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), raw(0x08, 0, 1, u16(99))),
                events(started(1, "/p.S/M"), ev("Cancelled", call_id=1, code="UNKNOWN")),
                sent(),
            ],
        )
    )
    v.append(
        session(
            "server_pings_share_one_answer",
            "Three PINGs arrive while the answer to the first is unsent: one answer goes, with the "
            "first PING's data (§5.9, §9); a PING after it was sent gets its own.",
            "server",
            server_hello_steps()
            + [
                recv(ping(b"pingone!"), ping(b"pingtwo!"), ping(b"pingthre")),
                sent(ping(b"pingone!", ack=True)),
                recv(ping(b"pingfour")),
                sent(ping(b"pingfour", ack=True)),
            ],
        )
    )
    v.append(
        session(
            "client_unsolicited_ping_ack_ignored",
            "A PING ACK that answers no PING of ours is ignored: no event (§5.9).",
            "client",
            client_hello_steps()
            + [
                recv(ping(b"whatever", ack=True)),
                events(),
                cmd("ping", data_hex=b"realping"),
                sent(ping(b"realping")),
                recv(ping(b"realping", ack=True)),
                events(ev("Pong", data_hex=b"realping")),
            ],
        )
    )
    v.append(
        session(
            "server_split_violation_on_ended_call_ignored",
            "Frames for calls that are not open are ignored before any other check of their "
            "payload (§6): a SPLIT MESSAGE whose chunk already holds total_len, on an ended call.",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M")),
                events(started(1, "/p.S/M")),
                cmd("end_call", call_id=1, code="OK", message="", trailers=[]),
                sent(end(1, "OK")),
                recv(raw(0x03, 0x02, 1, u32(3) + b"abcdef")),
                events(),
                sent(),
            ],
        )
    )
    v.append(
        session(
            "client_refuses_calls_when_the_server_takes_none",
            "The server's MAX_CONCURRENT_CALLS is 0: the client fails new calls locally (with "
            "UNAVAILABLE) instead of queueing them for ever, and sends nothing (§9).",
            "client",
            client_hello_steps([(2, 0)])
            + [
                cmd(
                    "start_call",
                    method="/p.S/M",
                    codec=0,
                    timeout_us=0,
                    metadata=[],
                    refused=True,
                ),
                sent(),
            ],
        )
    )
    v.append(
        session(
            "server_refused_calls_within_budget",
            "CALLs over MAX_CONCURRENT_CALLS (here 0) are refused with END RESOURCE_EXHAUSTED; "
            "within the local budget of refused calls (here 2) the connection goes on (§9).",
            "server",
            server_hello_steps()
            + [
                recv(call(1, 0, "/p.S/M"), call(2, 0, "/p.S/M")),
                events(),
                sent(
                    {"type": "END", "call_id": 1, "code": "RESOURCE_EXHAUSTED"},
                    {"type": "END", "call_id": 2, "code": "RESOURCE_EXHAUSTED"},
                ),
            ],
            local_settings={"MAX_CONCURRENT_CALLS": 0},
            local_limits={"REFUSED_CALL_BURST": 2},
        )
    )
    return v


def bad(
    name,
    description,
    role,
    steps,
    code,
    *,
    local_settings=None,
    local_limits=None,
    check_error_frame=True,
    events_after=None,
) -> dict:
    tail = [expect_error(code)]
    if check_error_frame:
        tail.append(sent({"type": "ERROR", "code": code}))
    if events_after is not None:
        tail.append(events(*events_after))
    return session(name, description, role, steps + tail, local_settings, local_limits)


def sessions_invalid() -> list:
    sh = server_hello_steps()
    ch = client_hello_steps()
    sc = [
        cmd(
            "start_call", method="/p.S/M", codec=0, timeout_us=0, metadata=[], call_id=1
        ),
        sent({"type": "CALL", "call_id": 1}),
    ]
    c1 = call(1, 0, "/p.S/M")
    return [
        bad(
            "bad_preface",
            "The client's first bytes are an HTTP request, not the topspin preface (§2). The "
            "ERROR frame is optional here, so it is not checked.",
            "server",
            [recv(b"GET / HTTP/1.1\r\n\r\n")],
            "BAD_PREFACE",
            check_error_frame=False,
        ),
        bad(
            "bad_preface_from_server",
            "The client receives a preface with the wrong magic 'TOPSPIM'.",
            "client",
            [recv(b"TOPSPIM\x01", settings([]))],
            "BAD_PREFACE",
            check_error_frame=False,
        ),
        bad(
            "unsupported_version",
            "Preface version 2: the receiver sends its preface and SETTINGS, then ERROR "
            "UNSUPPORTED_VERSION (§2).",
            "server",
            [recv(b"TOPSPIN\x02", settings([]))],
            "UNSUPPORTED_VERSION",
        ),
        bad(
            "settings_not_first",
            "The first frame after the preface is a PING, not SETTINGS (§2).",
            "server",
            [recv(PREFACE, ping(b"12345678"))],
            "SETTINGS_ERROR",
        ),
        bad(
            "settings_not_first_call",
            "The first frame after the preface is a CALL.",
            "server",
            [recv(PREFACE, c1)],
            "SETTINGS_ERROR",
        ),
        bad(
            "settings_repeated",
            "A second SETTINGS frame (§4).",
            "server",
            sh + [recv(settings([]))],
            "SETTINGS_ERROR",
        ),
        bad(
            "settings_out_of_range",
            "The peer's MAX_FRAME_SIZE is 16383, below the minimum.",
            "client",
            [recv(PREFACE, raw(0x01, 0, 0, u16(1) + u32(16_383)))],
            "SETTINGS_ERROR",
        ),
        bad(
            "client_settings_not_first",
            "The server's first frame after its preface is HEADERS.",
            "client",
            [recv(PREFACE, headers(1))],
            "SETTINGS_ERROR",
        ),
        bad(
            "frame_too_large",
            "A header announcing 16385 bytes against MAX_FRAME_SIZE 16384: refused from the "
            "header alone (§3).",
            "server",
            sh + [recv(raw(0x03, 0, 1, b"", length=16_385))],
            "FRAME_TOO_LARGE",
            local_settings={"MAX_FRAME_SIZE": 16_384},
        ),
        bad(
            "unknown_frame_type",
            "Frame type 0x0d on an established connection.",
            "server",
            sh + [recv(raw(0x0D, 0, 0, b""))],
            "UNKNOWN_FRAME_TYPE",
        ),
        bad(
            "unknown_call",
            "A MESSAGE for call 1 before any CALL (§6). The connection closes.",
            "server",
            sh + [recv(message(1, b"x"))],
            "UNKNOWN_CALL",
            events_after=[ev("Closed", error="UNKNOWN_CALL")],
        ),
        bad(
            "unknown_call_above_highest",
            "CREDIT for call 2 when the highest call id seen is 1.",
            "server",
            sh + [recv(c1, credit(2, 10))],
            "UNKNOWN_CALL",
        ),
        bad(
            "client_unknown_call",
            "END for call 2 when the client has allocated only call 1.",
            "client",
            ch + sc + [recv(end(2))],
            "UNKNOWN_CALL",
        ),
        bad(
            "duplicate_call_same_id",
            "Two CALLs with id 1 (§5.2).",
            "server",
            sh + [recv(c1, c1)],
            "DUPLICATE_CALL",
        ),
        bad(
            "duplicate_call_lower_id",
            "CALL 5 then CALL 3: ids must grow.",
            "server",
            sh + [recv(call(5, 0, "/p.S/M"), call(3, 0, "/p.S/M"))],
            "DUPLICATE_CALL",
        ),
        bad(
            "duplicate_call_after_end",
            "CALL 1 reused after call 1 ended.",
            "server",
            sh
            + [
                recv(c1),
                cmd("end_call", call_id=1, code="OK", message="", trailers=[]),
                sent(end(1)),
                recv(c1),
            ],
            "DUPLICATE_CALL",
        ),
        bad(
            "unbound_method_id",
            "CALL by method_id 7, which was never bound (§5.2).",
            "server",
            sh + [recv(call(1, 7, None))],
            "METHOD_ID_ERROR",
        ),
        bad(
            "method_id_rebound",
            "Binding method_id 1 a second time (even to the same name).",
            "server",
            sh + [recv(call(1, 1, "/p.S/M"), call(2, 1, "/p.S/M"))],
            "METHOD_ID_ERROR",
        ),
        bad(
            "method_id_above_1023",
            "NAMED CALL binding method_id 1024.",
            "server",
            sh + [recv(call(1, 1024, "/p.S/M"))],
            "METHOD_ID_ERROR",
        ),
        bad(
            "interned_method_id_zero",
            "CALL with NAMED clear and method_id 0.",
            "server",
            sh + [recv(call(1, 0, None))],
            "METHOD_ID_ERROR",
        ),
        bad(
            "credit_overflow",
            "CREDIT 2^31-1 on top of the initial 1 MiB of send credit (§7). The open call is "
            "over (Cancelled; §10 does not say with which status on a server) and the "
            "connection closes.",
            "server",
            sh + [recv(c1, credit(1, MAX_WINDOW))],
            "FLOW_CONTROL",
            events_after=[
                started(1, "/p.S/M"),
                ev("Cancelled", call_id=1),
                ev("Closed", error="FLOW_CONTROL"),
            ],
        ),
        bad(
            "credit_overflow_by_one",
            "With the client's INITIAL_CALL_WINDOW 0, CREDIT 2^31-1 reaches the maximum exactly; "
            "one more byte overflows.",
            "server",
            server_hello_steps([(3, 0)])
            + [recv(c1, credit(1, MAX_WINDOW)), recv(credit(1, 1))],
            "FLOW_CONTROL",
        ),
        bad(
            "client_credit_overflow",
            "The server's CREDIT overflows the client's send credit: a connection error, so the "
            "client's open call fails with UNAVAILABLE (§10).",
            "client",
            ch + sc + [recv(credit(1, MAX_WINDOW - 1))],
            "FLOW_CONTROL",
            events_after=[
                ev("Ended", call_id=1, code="UNAVAILABLE"),
                ev("Closed", error="FLOW_CONTROL"),
            ],
        ),
        bad(
            "client_receives_error",
            "The server sends ERROR: the connection is closed with its code (which counts as "
            "the failure of that input), nothing is sent back, and the open call fails with "
            "UNAVAILABLE (§5.11, §10).",
            "client",
            ch + sc + [recv(error("INTERNAL_ERROR", "server bug"))],
            "INTERNAL_ERROR",
            check_error_frame=False,
            events_after=[
                ev("Ended", call_id=1, code="UNAVAILABLE"),
                ev("Closed", error="INTERNAL_ERROR"),
            ],
        ),
        session(
            "server_receives_error",
            "The client sends ERROR: the connection is closed with its code, nothing is sent "
            "back, and the open call is over (§5.11).",
            "server",
            sh
            + [
                recv(c1, error("TIMEOUT", "handshake took too long")),
                expect_error("TIMEOUT"),
                sent(),
                events(
                    started(1, "/p.S/M"),
                    ev("Cancelled", call_id=1),
                    ev("Closed", error="TIMEOUT"),
                ),
            ],
        ),
        bad(
            "message_without_credit",
            "The server's INITIAL_CALL_WINDOW is 0: it grants 1 byte when the call starts (§7), "
            "which the client's first MESSAGE uses up; a second MESSAGE has no credit.",
            "server",
            sh + [recv(c1, message(1, b""), message(1, b""))],
            "FLOW_CONTROL",
            local_settings={"INITIAL_CALL_WINDOW": 0},
        ),
        bad(
            "client_message_without_credit",
            "The client's INITIAL_CALL_WINDOW is 0: it grants 1 byte with its CALL (§7), which "
            "the server's first MESSAGE uses up; a second MESSAGE has no credit.",
            "client",
            ch + sc + [recv(headers(1), message(1, b"x"), message(1, b"y"))],
            "FLOW_CONTROL",
            local_settings={"INITIAL_CALL_WINDOW": 0},
        ),
        bad(
            "continuation_past_total_len",
            "total_len 5, first chunk 3, then a 3-byte CONTINUATION (§5.3).",
            "server",
            sh + [recv(c1, message(1, b"abc", total_len=5), continuation(1, b"def"))],
            "MESSAGE_LENGTH_MISMATCH",
        ),
        bad(
            "split_first_chunk_holds_total_len",
            "A SPLIT MESSAGE whose first chunk already holds all of total_len.",
            "server",
            sh + [recv(c1, message(1, b"abcde", total_len=5))],
            "MESSAGE_LENGTH_MISMATCH",
        ),
        bad(
            "split_first_chunk_longer_than_total_len",
            "A SPLIT MESSAGE longer than it declares: 6 bytes, total_len 5.",
            "server",
            sh + [recv(c1, message(1, b"abcdef", total_len=5))],
            "MESSAGE_LENGTH_MISMATCH",
        ),
        bad(
            "continuation_without_split",
            "A CONTINUATION with no split message open.",
            "server",
            sh + [recv(c1, message(1, b"whole"), continuation(1, b"more"))],
            "MESSAGE_LENGTH_MISMATCH",
        ),
        bad(
            "message_while_split_open",
            "A new MESSAGE on a call whose split message is not complete.",
            "server",
            sh + [recv(c1, message(1, b"ab", total_len=4), message(1, b"x"))],
            "MESSAGE_LENGTH_MISMATCH",
        ),
        bad(
            "end_from_client",
            "The client sends END, a server-only frame (§5).",
            "server",
            sh + [recv(c1, end(1))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "headers_from_client",
            "The client sends HEADERS.",
            "server",
            sh + [recv(c1, headers(1))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "end_from_client_on_an_unknown_call",
            "The client sends END for a call id it never opened: the sender check comes before "
            "the call lookup, so this is ILLEGAL_FRAME, not UNKNOWN_CALL (§5, §6).",
            "server",
            sh + [recv(end(9))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "cancel_from_server_on_an_unknown_call",
            "The server sends CANCEL for a call id the client never opened: ILLEGAL_FRAME before "
            "any call lookup (§5, §6).",
            "client",
            ch + [recv(cancel(9, "CANCELLED"))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "call_from_server",
            "The server sends CALL, a client-only frame.",
            "client",
            ch + [recv(call(1, 0, "/p.S/M"))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "half_close_from_server",
            "The server sends HALF_CLOSE.",
            "client",
            ch + sc + [recv(half_close(1))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "cancel_from_server",
            "The server sends CANCEL.",
            "client",
            ch + sc + [recv(cancel(1, "CANCELLED"))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "end_stream_from_server",
            "MESSAGE with END_STREAM from the server (§5.3).",
            "client",
            ch + sc + [recv(message(1, b"x", end_stream=True))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "headers_after_message",
            "HEADERS after the server's first MESSAGE (§5.4).",
            "client",
            ch + sc + [recv(message(1, b"x"), headers(1))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "headers_twice",
            "A second HEADERS on the same call.",
            "client",
            ch + sc + [recv(headers(1), headers(1))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "message_after_half_close",
            "A MESSAGE after HALF_CLOSE (§5.5).",
            "server",
            sh + [recv(c1, half_close(1), message(1, b"x"))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "message_after_end_stream",
            "A MESSAGE after a MESSAGE with END_STREAM.",
            "server",
            sh + [recv(c1, message(1, b"x", end_stream=True), message(1, b"y"))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "half_close_twice",
            "A HALF_CLOSE after the client has already half-closed with END_STREAM.",
            "server",
            sh + [recv(c1, message(1, b"x", end_stream=True), half_close(1))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "ping_on_call_in_session",
            "A connection frame on a call id, on an established connection.",
            "server",
            sh + [recv(c1, raw(0x0A, 0, 1, b"12345678"))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "ping_7_bytes_in_session",
            "A PING with 7 bytes of data.",
            "client",
            ch + [recv(raw(0x0A, 0, 0, b"1234567"))],
            "MALFORMED_FRAME",
        ),
        bad(
            "credit_zero_in_session",
            "CREDIT with increment 0 on an open call.",
            "server",
            sh + [recv(c1, raw(0x09, 0, 1, u32(0)))],
            "MALFORMED_FRAME",
        ),
        bad(
            "metadata_key_invalid_in_session",
            "CALL metadata with an upper-case key.",
            "server",
            sh
            + [
                recv(
                    raw(
                        0x02,
                        1,
                        1,
                        call_fixed() + u16(6) + b"/p.S/M" + md_raw([(b"Key", b"v")]),
                    )
                )
            ],
            "MALFORMED_FRAME",
        ),
        bad(
            "metadata_text_not_utf8_in_session",
            "HEADERS with a text value that is not UTF-8.",
            "client",
            ch + sc + [recv(raw(0x05, 0, 1, md_raw([(b"k", b"\xff")])))],
            "MALFORMED_FRAME",
        ),
        bad(
            "goaway_raises_last_call_id",
            "A second GOAWAY whose last_call_id is above the first's (§8.3).",
            "client",
            ch + [recv(goaway(0)), events(ev("GoAway", last_call_id=0)), recv(goaway(1))],
            "ILLEGAL_FRAME",
        ),
        bad(
            "call_after_clients_own_goaway",
            "A CALL from a client after its own GOAWAY (§8.3).",
            "server",
            sh + [recv(goaway(0)), events(ev("GoAway", last_call_id=0)), recv(c1)],
            "ILLEGAL_FRAME",
        ),
        bad(
            "error_as_first_frame",
            "An ERROR as the first frame after the preface is the peer's error, reported with its "
            "code, not SETTINGS_ERROR; nothing is sent back (§2, §10).",
            "server",
            [recv(PREFACE, error("BAD_PREFACE", "that was not topspin"))],
            "BAD_PREFACE",
            check_error_frame=False,
        ),
        bad(
            "unknown_frame_type_first",
            "The first frame after the preface has type 0x0D: header checks come before the "
            "SETTINGS-first rule (§2), so UNKNOWN_FRAME_TYPE.",
            "server",
            [recv(PREFACE, raw(0x0D, 0, 0, b""))],
            "UNKNOWN_FRAME_TYPE",
        ),
        bad(
            "extension_first",
            "The first frame after the preface is an ignorable extension (0x80): it is valid on "
            "its own, so the SETTINGS-first rule applies: SETTINGS_ERROR (§2).",
            "server",
            [recv(PREFACE, raw(0x80, 0, 0, b""))],
            "SETTINGS_ERROR",
        ),
        bad(
            "split_chunk_holds_total_before_size_limit",
            "A SPLIT MESSAGE whose chunk holds all of total_len, over MAX_MESSAGE_SIZE too: the "
            "connection error (visible in the frame) comes before the call error (§5.3).",
            "server",
            sh + [recv(c1, message(1, b"abcde", total_len=5))],
            "MESSAGE_LENGTH_MISMATCH",
            local_settings={"MAX_MESSAGE_SIZE": 2},
        ),
        bad(
            "message_after_half_close_without_credit",
            "A MESSAGE after END_STREAM on a call without credit: state checks come before flow "
            "control (§5.3, §7), so ILLEGAL_FRAME.",
            "server",
            sh + [recv(c1, message(1, b"", end_stream=True), message(1, b""))],
            "ILLEGAL_FRAME",
            local_settings={"INITIAL_CALL_WINDOW": 0},
        ),
        bad(
            "server_handlers_see_unavailable",
            "A connection error with a call open: the server cancels the call's handler with "
            "UNAVAILABLE (§10).",
            "server",
            sh + [recv(c1), events(started(1, "/p.S/M")), recv(raw(0x0D, 0, 0, b""))],
            "UNKNOWN_FRAME_TYPE",
            events_after=[
                ev("Cancelled", call_id=1, code="UNAVAILABLE"),
                ev("Closed", error="UNKNOWN_FRAME_TYPE"),
            ],
        ),
        session(
            "ping_flood",
            "PINGs past the local ping budget (here a burst of 2, time not passing): the receiver "
            "answers the first (one answer while unsent), then closes with GOAWAY and ERROR "
            "ENHANCE_YOUR_CALM (§9, §10).",
            "server",
            sh
            + [
                recv(ping(b"pingone!"), ping(b"pingtwo!"), ping(b"pingthre")),
                expect_error("ENHANCE_YOUR_CALM"),
                sent(
                    ping(b"pingone!", ack=True),
                    {"type": "GOAWAY", "code": "ENHANCE_YOUR_CALM"},
                    {"type": "ERROR", "code": "ENHANCE_YOUR_CALM"},
                ),
            ],
            local_limits={"PING_BURST": 2},
        ),
        session(
            "rapid_reset",
            "Calls the client cancels before the server answered them, past the local budget "
            "(here 2): GOAWAY and ERROR ENHANCE_YOUR_CALM; the third call's handler is told "
            "UNAVAILABLE with the others (§9, §10).",
            "server",
            sh
            + [
                recv(
                    c1,
                    cancel(1, "CANCELLED"),
                    call(2, 0, "/p.S/M"),
                    cancel(2, "CANCELLED"),
                    call(3, 0, "/p.S/M"),
                    cancel(3, "CANCELLED"),
                ),
                expect_error("ENHANCE_YOUR_CALM"),
                sent(
                    {"type": "GOAWAY", "last_call_id": 3, "code": "ENHANCE_YOUR_CALM"},
                    {"type": "ERROR", "code": "ENHANCE_YOUR_CALM"},
                ),
                events(
                    started(1, "/p.S/M"),
                    ev("Cancelled", call_id=1, code="CANCELLED"),
                    started(2, "/p.S/M"),
                    ev("Cancelled", call_id=2, code="CANCELLED"),
                    started(3, "/p.S/M"),
                    ev("Cancelled", call_id=3, code="UNAVAILABLE"),
                    ev("Closed", error="ENHANCE_YOUR_CALM"),
                ),
            ],
            local_limits={"RAPID_RESET_BURST": 2},
        ),
        session(
            "refused_call_flood",
            "CALLs over MAX_CONCURRENT_CALLS (here 0) past the local budget of refused calls "
            "(here 1): the first is refused with END, the second closes the connection with "
            "GOAWAY and ERROR ENHANCE_YOUR_CALM (§9, §10).",
            "server",
            sh
            + [
                recv(c1, call(2, 0, "/p.S/M")),
                expect_error("ENHANCE_YOUR_CALM"),
                sent(
                    {"type": "END", "call_id": 1, "code": "RESOURCE_EXHAUSTED"},
                    {"type": "GOAWAY", "last_call_id": 2, "code": "ENHANCE_YOUR_CALM"},
                    {"type": "ERROR", "code": "ENHANCE_YOUR_CALM"},
                ),
            ],
            local_settings={"MAX_CONCURRENT_CALLS": 0},
            local_limits={"REFUSED_CALL_BURST": 1},
        ),
    ]


# --- docs/protocol-examples.md -------------------------------------------------------------------


def dump_segments(segs) -> list:
    lines = []
    for b, label in segs:
        if not b:
            lines.append(f"    {'(0 bytes)':<50}{label}")
            continue
        chunks = [b[i : i + 16] for i in range(0, len(b), 16)]
        for k, chunk in enumerate(chunks):
            hx = " ".join(f"{x:02x}" for x in chunk)
            lines.append(f"    {hx:<50}{label if k == 0 else ''}".rstrip())
    return lines


def render_conversation(title, intro, conversation) -> list:
    out = [f"## {title}", "", textwrap.fill(intro, 100), ""]
    total = {"client → server": b"", "server → client": b""}
    for i, (direction, note, frame) in enumerate(conversation, 1):
        if frame is None:
            segs = [(b"TOPSPIN", "magic 'TOPSPIN'"), (b"\x01", "version = 1")]
            data = PREFACE
        else:
            segs = frame.segs
            data = frame.bytes
        total[direction] += data
        out += [f"**{i}. {direction}**: {note} ({len(data)} bytes)", "", "```"]
        out += dump_segments(segs)
        out += ["```", ""]
    out += ["The whole byte stream in each direction:", ""]
    for direction, data in total.items():
        out += [f"{direction} ({len(data)} bytes):", "", "```"]
        out += [data[i : i + 32].hex() for i in range(0, len(data), 32)]
        out += ["```", ""]
    return out


def examples_doc() -> str:
    out = [
        "# Protocol worked examples",
        "",
        "<!-- Generated by testdata/vectors/gen.py; do not edit by hand. -->",
        "",
        "The companion of [protocol.md](protocol.md) §13: two complete conversations, byte by byte.",
        "Every frame is shown as its 12-byte header (length, type, flags, reserved, call_id) and its",
        "payload fields, each named as in protocol.md; all integers are little-endian. The bytes come",
        "from `testdata/vectors/gen.py`, an encoder written from protocol.md independently of any",
        "implementation, and the same conversations are the test vectors `worked_unary`,",
        "`worked_unary_client`, `worked_bidi` and `worked_bidi_client` in",
        "`testdata/vectors/sessions_valid.json`, which every implementation runs.",
        "",
    ]
    out += render_conversation(
        "1. A unary call",
        f"The client calls `{UNARY_METHOD}` with the protobuf request `HelloRequest {{ name: "
        '"world" }` and a 2-second deadline; the server answers `HelloReply { message: "Hello '
        'world" }`. The client names the method and binds it to method id 1, so a later call on '
        "the same connection could send just the id. The client's request carries END_STREAM, "
        "so no separate HALF_CLOSE is needed.",
        unary_conversation(),
    )
    out += render_conversation(
        "2. A bidirectional stream",
        f"The client opens `{BIDI_METHOD}` with the raw codec (1) and the two sides exchange two "
        "messages each way. The method is named for this call only (method id 0). The server "
        "sends no HEADERS, which means empty response headers. The client half-closes with "
        "HALF_CLOSE; the server ends the call with OK and one trailer.",
        bidi_conversation(),
    )
    return "\n".join(out).rstrip() + "\n"


# --- output --------------------------------------------------------------------------------------


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Message compression (protocol.md §15): a payload on a direction that uses an encoding, the
# receiver's MAX_MESSAGE_SIZE, and what it decodes to (or the status its call ends with).

# Made by the reference zstd encoder (level 1); Python's standard library has no zstd, and a
# decoder must accept any valid zstd stream, not only these bytes.
ZSTD_TOPSPIN_X40 = "28b52ffd6040007d000040746f707370696e20010035530b17"
ZSTD_1MIB_ZEROS = (
    "28b52ffd8048000010005400001000000100fbff39c00202001000020010000200100002"
    "001000020010000200100003001000"
)


def gzip_bytes(data: bytes, level: int) -> bytes:
    import gzip
    import io

    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=level) as f:
        f.write(data)
    return buf.getvalue()


def compression_vectors() -> list:
    msg = b"topspin " * 40
    gz = gzip_bytes(msg, 6)
    bomb = gzip_bytes(b"\0" * (1 << 20), 9)

    def ok(name, enc, payload, limit, message, what):
        return {
            "name": name,
            "description": what + " (protocol.md §15)",
            "kind": "compression",
            "encoding": enc,
            "payload": payload.hex(),
            "limit": limit,
            "message": message.hex(),
        }

    def bad(name, enc, payload, limit, code, what):
        return {
            "name": name,
            "description": what + " (protocol.md §15)",
            "kind": "compression",
            "encoding": enc,
            "payload": payload.hex(),
            "limit": limit,
            "code": code,
        }

    z = bytes.fromhex(ZSTD_TOPSPIN_X40)
    return [
        ok("compression_plain_flag", "zstd", b"\x00hi", 1024, b"hi",
           "Flag 0: the rest is the message as is"),
        ok("compression_plain_empty_message", "gzip", b"\x00", 1024, b"",
           "Flag 0 and nothing else: an empty message"),
        ok("compression_zstd", "zstd", b"\x01" + z, 1024, msg,
           "Flag 1: the rest is a zstd frame"),
        ok("compression_gzip", "gzip", b"\x01" + gz, 1024, msg,
           "Flag 1: the rest is a gzip member"),
        ok("compression_exactly_at_the_limit", "gzip", b"\x01" + gz, len(msg), msg,
           "A message that decompresses to exactly MAX_MESSAGE_SIZE is accepted"),
        bad("compression_one_over_the_limit", "zstd", b"\x01" + z, len(msg) - 1,
            "RESOURCE_EXHAUSTED", "One byte past MAX_MESSAGE_SIZE after decompression"),
        bad("compression_zstd_bomb", "zstd", b"\x01" + bytes.fromhex(ZSTD_1MIB_ZEROS), 65536,
            "RESOURCE_EXHAUSTED",
            "1 MiB of zeros in 51 bytes: the receiver stops at its limit, never allocating more"),
        bad("compression_gzip_bomb", "gzip", b"\x01" + bomb, 65536, "RESOURCE_EXHAUSTED",
            "1 MiB of zeros in about 1 kB: the receiver stops at its limit"),
        bad("compression_missing_flag", "zstd", b"", 1024, "INTERNAL",
            "An empty payload on a compressed direction has no flag byte"),
        bad("compression_unknown_flag", "gzip", b"\x02" + gz, 1024, "INTERNAL",
            "Flag values other than 0 and 1 are call errors"),
        bad("compression_corrupt_body", "zstd", b"\x01\xde\xad\xbe\xef", 1024, "INTERNAL",
            "A compressed body that does not decode is a call error"),
        ok("compression_zstd_window_8_mib", "zstd", b"\x01" + zstd_raw_frame(b"\x00\x68", b"hi"),
           1 << 26, b"hi", "A zstd frame declaring an 8 MiB window (the most a receiver allows)"),
        bad("compression_zstd_window_over_8_mib", "zstd",
            b"\x01" + zstd_raw_frame(b"\x00\x88", b"hi"), 1 << 26, "RESOURCE_EXHAUSTED",
            "A zstd frame declaring a 128 MiB window: refused before anything is allocated, "
            "whatever its content"),
        bad("compression_zstd_content_size_over_the_limit", "zstd",
            b"\x01" + zstd_raw_frame(b"\xa0\x00\x00\x00\x01", b"hi"), 1024,
            "RESOURCE_EXHAUSTED",
            "A one-segment zstd frame declaring 16 MiB of content against a 1 KiB limit: "
            "refused from its header"),
    ]


def zstd_raw_frame(header: bytes, content: bytes) -> bytes:
    """A zstd frame (RFC 8878): magic, `header` (descriptor and window or content size), then
    `content` in one raw last block."""
    block = 1 | len(content) << 3
    return b"\x28\xb5\x2f\xfd" + header + block.to_bytes(3, "little") + content



def render(vectors) -> str:
    """JSON with one vector field, one session step, per line: easy to read and to diff."""
    out = ["{", '  "version": 1,', '  "vectors": [']
    for i, v in enumerate(vectors):
        out.append("    {")
        items = list(v.items())
        for j, (k, val) in enumerate(items):
            comma = "," if j < len(items) - 1 else ""
            if k == "steps":
                out.append('      "steps": [')
                for n, step in enumerate(val):
                    out.append(
                        f"        {dumps(step)}" + ("," if n < len(val) - 1 else "")
                    )
                out.append("      ]" + comma)
            else:
                out.append(f"      {dumps(k)}: {dumps(val)}{comma}")
        out.append("    }" + ("," if i < len(vectors) - 1 else ""))
    out += ["  ]", "}"]
    text = "\n".join(out) + "\n"
    assert json.loads(text) == {"version": 1, "vectors": vectors}
    return text


def outputs() -> dict:
    files = {
        "frames_valid.json": frames_valid(),
        "frames_invalid.json": frames_invalid(),
        "sessions_valid.json": sessions_valid(),
        "sessions_invalid.json": sessions_invalid(),
        "compression.json": compression_vectors(),
    }
    names = [v["name"] for vs in files.values() for v in vs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    assert not dupes, f"duplicate vector names: {dupes}"
    # Every hex value must survive the compression used in the JSON.
    for vs in files.values():
        for v in vs:
            if "hex" in v:
                assert unhexval(v["hex"]) == unhexval(hexval(unhexval(v["hex"])))
    out = {HERE / name: render(vs) for name, vs in files.items()}
    out[EXAMPLES_DOC] = examples_doc()
    return out


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for path, text in outputs().items():
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            continue
        if check:
            stale.append(path)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    for path in stale:
        print(
            f"out of date: {path.relative_to(ROOT)} (run python3 testdata/vectors/gen.py)"
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
