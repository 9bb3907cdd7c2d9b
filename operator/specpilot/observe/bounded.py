"""Bounded reads of HTTP endpoints the operator does not control: serving pods' /metrics and Prometheus.

One operator serves every namespace, so what it reads from one tenant's endpoint must not exhaust it, and
what it tells the tenant about a failure must not carry the endpoint's answer (the operator reads from its
own network position: an answer echoed into a condition or an Event would leak what only it can reach).
`bounded_get` therefore:
- reads at most `max_bytes` of the body (the declared Content-Length is checked first), in chunks as they
  arrive, and stops there;
- gives the whole request (connect, headers, body) `timeout_s`, so a server that trickles bytes is cut off;
- follows no redirect (a redirect would send the operator elsewhere) and asks for no compression (a small
  compressed body could inflate past the bound before it is counted);
- never reads the body of a non-200 answer, and says only the status code and the declared size.
Every message of `ReadRefused` is built here from numbers and fixed words, never from the answer.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import aiohttp

from specpilot.config import MetricsReadLimits

CHUNK_BYTES = 64 * 1024
EXCERPT_CHARS = 120
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """Bounds of one kind of read, and the config keys that set them (named in messages)."""

    max_bytes: int = 4 * 2**20
    timeout_s: float = 5.0
    max_series: int = 10_000
    timeout_setting: str = "metricsReadLimits.scrapeTimeoutSeconds"

    @classmethod
    def for_pods(cls, limits: MetricsReadLimits) -> ReadLimits:
        return cls(limits.max_response_bytes, limits.scrape_timeout_seconds, limits.max_series,
                   "metricsReadLimits.scrapeTimeoutSeconds")

    @classmethod
    def for_prometheus(cls, limits: MetricsReadLimits) -> ReadLimits:
        return cls(limits.max_response_bytes, limits.prometheus_timeout_seconds, limits.max_series,
                   "metricsReadLimits.prometheusTimeoutSeconds")


class ReadRefused(Exception):
    """Nothing usable was read. `why` is safe to show anywhere (it holds no byte of the answer); `cut` is
    True when a bound (size, time, series) stopped the read, False for an ordinary failure."""

    def __init__(self, why: str, *, cut: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.cut = cut


def size_text(n: int) -> str:
    """4 MiB, 512 KiB, 1000 bytes."""
    for unit, factor in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} bytes"


def safe_excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of `text` with every control character replaced: for text the operator
    itself chose (a URL from a spec, an exception class), never for an endpoint's answer."""
    cleaned = _UNSAFE.sub("?", str(text))
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def new_session(limits: ReadLimits, headers: Mapping[str, str] | None = None) -> aiohttp.ClientSession:
    """A session for bounded reads: whole-request timeout, no decompression, no proxy from the environment."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=limits.timeout_s),
        auto_decompress=False,
        headers={"Accept-Encoding": "identity", **(headers or {})},
        trust_env=False,
    )


async def bounded_get(session: aiohttp.ClientSession, url: str, limits: ReadLimits,
                      params: Mapping[str, str] | None = None) -> bytes:
    """The body of a 200 answer to GET `url`, at most limits.max_bytes; raises ReadRefused otherwise."""
    try:
        async with session.get(url, params=params, allow_redirects=False) as response:
            if response.status != 200:
                declared = response.content_length
                size = f", {declared} bytes, not shown" if declared is not None else ", not shown"
                raise ReadRefused(f"HTTP {response.status}{size}")
            encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise ReadRefused("a compressed answer, which is refused (the size bound counts plain bytes)")
            declared = response.content_length
            if declared is not None and declared > limits.max_bytes:
                raise ReadRefused(f"answer of {declared} bytes is over the {size_text(limits.max_bytes)} limit "
                                  f"(metricsReadLimits.maxResponseBytes): not read", cut=True)
            body = bytearray()
            async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                body += chunk
                if len(body) > limits.max_bytes:
                    raise ReadRefused(f"answer over the {size_text(limits.max_bytes)} limit "
                                      f"(metricsReadLimits.maxResponseBytes): not read further", cut=True)
            return bytes(body)
    except TimeoutError as error:
        raise ReadRefused(f"no complete answer within {limits.timeout_s:g} s ({limits.timeout_setting})",
                          cut=True) from error
    except aiohttp.ClientConnectorError as error:
        raise ReadRefused("cannot connect") from error
    except aiohttp.ClientError as error:
        raise ReadRefused(f"the connection failed ({type(error).__name__})") from error
