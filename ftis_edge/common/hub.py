"""Is the Hugging Face hub there? Asked before a download, so that an offline machine gets one
clear line at once instead of five noisy retries before the same answer."""
from __future__ import annotations

import os
import re
import socket
import threading


def offline_env() -> bool:
    """The user said offline (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def reachable(timeout: float = 2.0) -> bool:
    """Fast connectivity probe (DNS + TCP) run in a thread so a hanging resolver cannot block us."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = re.sub(r"^https?://", "", endpoint).split("/")[0].split(":")[0]
    ok = []

    def probe():
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok)
