"""Parsing of what people type and upload: the dashboard's edge, where units are parsed.

Every function raises :class:`dashboards.errors.DashboardError` naming the field and the
value it could not understand; callbacks show that message on the page.
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Iterable, Mapping
from urllib.parse import parse_qsl, urlencode

from dashboards.errors import DashboardError

#: Largest upload accepted (bytes, after base64 decoding).
MAX_UPLOAD_BYTES = 20 * 2**20


def parse_int_list(text: Any, field: str, *, min_value: int = 1, max_value: int = 1 << 20,
                   max_items: int = 64) -> tuple[int, ...]:
    """``"8, 16,64"`` -> ``(8, 16, 64)``: sorted, unique, each in [min_value, max_value]."""
    if text is None or (isinstance(text, str) and not text.strip()):
        raise DashboardError(f"{field}: empty; give a comma-separated list such as 8,16,64")
    items = text if isinstance(text, (list, tuple)) else str(text).replace(";", ",").split(",")
    out = set()
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            raise DashboardError(f"{field}: {item!r} is not a whole number") from None
        if not min_value <= value <= max_value:
            raise DashboardError(f"{field}: {value} is outside [{min_value}, {max_value}]")
        out.add(value)
    if not out:
        raise DashboardError(f"{field}: empty; give a comma-separated list such as 8,16,64")
    if len(out) > max_items:
        raise DashboardError(f"{field}: {len(out)} values; at most {max_items}")
    return tuple(sorted(out))


def parse_int(value: Any, field: str, *, min_value: int = 1, max_value: int = 1 << 40) -> int:
    """A whole number in [min_value, max_value] from a number input or text."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DashboardError(f"{field}: empty; give a whole number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DashboardError(f"{field}: {value!r} is not a number") from None
    if number != int(number):
        raise DashboardError(f"{field}: {value!r} is not a whole number")
    if not min_value <= int(number) <= max_value:
        raise DashboardError(f"{field}: {int(number)} is outside [{min_value}, {max_value}]")
    return int(number)


def parse_size(text: Any, field: str) -> int:
    """A message size such as ``"256MB"`` or ``"1048576"`` -> bytes (> 0)."""
    import topologies

    if text is None or not str(text).strip():
        raise DashboardError(f"{field}: empty; give a size such as 64MB")
    try:
        nbytes = int(topologies.parse_bytes(str(text).strip()))
    except ValueError as exc:
        raise DashboardError(f"{field}: {text!r} is not a size ({exc})") from None
    if nbytes <= 0:
        raise DashboardError(f"{field}: {text!r} must be more than 0 bytes")
    return nbytes


def parse_choice(value: Any, field: str, allowed: Iterable[str]) -> str | None:
    """``value`` if it is one of ``allowed``, None when empty (the default the field's
    placeholder says); else a one-line DashboardError naming the field and what is allowed.

    >>> parse_choice("", "whatif-precision", ["fp32"]) is None
    True
    >>> parse_choice("fp8", "whatif-precision", ["fp32", "tf32"])
    Traceback (most recent call last):
    ...
    dashboards.errors.DashboardError: whatif-precision: 'fp8' is not one of fp32, tf32
    """
    if value in (None, ""):
        return None
    allowed = list(allowed)
    if value not in allowed:
        raise DashboardError(f"{field}: {value!r} is not one of {', '.join(allowed)}")
    return value


def require_selection(values: Iterable[Any] | None, field: str) -> list:
    """A non-empty selection from a checklist or multi-dropdown."""
    values = [v for v in (values or []) if v is not None and v != ""]
    if not values:
        raise DashboardError(f"{field}: nothing selected; pick at least one")
    return values


def decode_upload(contents: str | None, filename: str | None, field: str) -> bytes:
    """The bytes of a ``dcc.Upload`` (a ``data:...;base64,...`` URL)."""
    if not contents:
        raise DashboardError(f"{field}: no file uploaded")
    name = filename or "upload"
    header, sep, payload = contents.partition(",")
    if not sep or ";base64" not in header:
        raise DashboardError(f"{field}: {name!r} did not arrive as a base64 data URL")
    if len(payload) * 3 // 4 > MAX_UPLOAD_BYTES:
        raise DashboardError(f"{field}: {name!r} is larger than {MAX_UPLOAD_BYTES} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise DashboardError(f"{field}: {name!r} is not valid base64") from None


def upload_text(contents: str | None, filename: str | None, field: str) -> str:
    """An uploaded text file, decoded as UTF-8."""
    data = decode_upload(contents, filename, field)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DashboardError(f"{field}: {filename!r} is not UTF-8 text (byte {exc.start})") from None


def upload_json(contents: str | None, filename: str | None, field: str) -> dict:
    """An uploaded JSON object."""
    text = upload_text(contents, filename, field)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DashboardError(
            f"{field}: {filename!r} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(data, dict):
        raise DashboardError(f"{field}: {filename!r} holds a JSON {type(data).__name__}, not an object")
    return data


# --- URL state -----------------------------------------------------------------------

def to_query(state: Mapping[str, Any]) -> str:
    """Inputs -> ``?key=value&...`` (lists joined by commas; None and empty values left out)."""
    flat = {}
    for key, value in state.items():
        if value is None or value == "" or value == []:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        flat[key] = str(value)
    return "?" + urlencode(flat) if flat else ""


def from_query(search: str | Mapping[str, str] | None) -> dict[str, str]:
    """``?key=value&...`` (or an already parsed dict) -> dict of strings."""
    if search is None:
        return {}
    if isinstance(search, Mapping):
        return {str(k): str(v) for k, v in search.items()}
    return dict(parse_qsl(search.lstrip("?")))


def query_list(query: Mapping[str, str], key: str, default: list, cast=str) -> list:
    """A comma-separated query value as a list; ``default`` when absent or not castable."""
    if key not in query:
        return list(default)
    try:
        return [cast(v) for v in query[key].split(",") if v != ""]
    except ValueError:
        return list(default)


# --- layout helpers ------------------------------------------------------------------

def field(label: str, component) -> Any:
    """A labelled form field: the label above its input, tied to it by ``htmlFor``."""
    from dash import html

    return html.Div([html.Label(label, htmlFor=component.id), component], className="field")


def compute_fields(page: str, query: Mapping[str, str], devices: list, precisions: list,
                   checkpointing: list, attention: list = ()) -> list:
    """The fields the compute model reads, for the What-if and the Recommend pages alike.

    Parameters
    ----------
    page : str
        The page's name, the prefix of the fields' ids (``{page}-device`` and so on).
    query : Mapping[str, str]
        The URL's query (:func:`from_query`): each field shows the value of its key
        (``device``, ``batch``, ``precision``, ``checkpointing``, ``attention``), else empty.
    devices, precisions, checkpointing, attention : list
        The choices of the target device, the precision, the activation checkpointing and the
        fused attention kernel.

    Returns
    -------
    list
        Labelled fields: target device, batch per GPU, precision, activation checkpointing and
        attention kernel. Empty says what the job assumes: the topology's own GPU, the model's
        usual batch, the GPU's usual precision, the checkpointing the trace was recorded with
        and FlashAttention-2 (what PyTorch's SDPA runs).
    """
    from dash import dcc

    def choice(name, options, placeholder):
        return dcc.Dropdown(id=f"{page}-{name}", options=list(options),
                            value=query.get(name) or None, placeholder=placeholder)

    return [field("target device", choice("device", devices, "the topology's own GPU")),
            field("batch per GPU", dcc.Input(id=f"{page}-batch", type="number", min=1, step=1,
                                             debounce=True, value=query.get("batch") or None,
                                             placeholder="the model's usual")),
            field("precision", choice("precision", precisions,
                                      "the GPU's usual (amp-bf16 from Ampere)")),
            field("activation checkpointing", choice("checkpointing", checkpointing,
                                                     "as the trace was recorded (none)")),
            field("attention kernel", choice("attention", attention,
                                             "FlashAttention-2 (PyTorch's SDPA)"))]


def human(key: str, value: Any) -> str:
    """A summary value for people: bandwidths in GB/s, latencies in us, others as they are."""
    if isinstance(value, dict):
        return ", ".join(f"{k}: {human(key, v)}" for k, v in value.items())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "bandwidth" in key:
            return f"{value / 1e9:.4g} GB/s"
        if "latency" in key:
            return f"{value * 1e6:.4g} us"
        if isinstance(value, float):
            return f"{value:.4g}"
    return str(value)
