"""Online mode: decorate an agent, run it, and find attributions of its silent failures in the store.

``observe`` (``decorator``) traces each run of an agent; ``configure`` (``setup``) builds the :class:`Runtime`
(``runtime``): a span processor on the application's tracer provider, a bounded queue and one worker thread that
hands each finished run to the :class:`~reflect_otel.attribution.service.AttributionService`.
"""

from __future__ import annotations

from reflect_otel.online.decorator import expect, observe
from reflect_otel.online.runtime import OnlineStats, Runtime
from reflect_otel.online.setup import OnlineSettings, configure, runtime, shutdown

__all__ = ["OnlineSettings", "OnlineStats", "Runtime", "configure", "expect", "observe", "runtime", "shutdown"]
