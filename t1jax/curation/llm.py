"""A tiny client for OpenAI-compatible chat servers (vLLM, SGLang, llama.cpp, OpenAI).

Why: task synthesis and the audit's judge each need one blocking chat call against a server the
user names; urllib keeps that free of new dependencies, and every failure names the URL so a
wrong port or a missing model is obvious from the message alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.error
import urllib.request

RETRIES = 2  # extra attempts after a connection error (not after an HTTP error reply)


class LLMError(RuntimeError):
    """A chat request failed; the message has the URL and the status or the reply's head."""


def endpoint(base_url: str) -> str:
    """`{base_url}/v1/chat/completions`; a base URL already ending in /v1 is accepted too."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return f"{base}/v1/chat/completions"


@dataclasses.dataclass(frozen=True)
class LLMConfig:
    """A chat server and how to ask it, for every caller (synthesis's rewriter, the audit's
    judge); the defaults are written here once (configs/common.py llm_config takes them)."""
    base_url: str = ""  # "": no server (the caller's feature is off)
    model: str = "default"
    temperature: float = 0.0
    max_tokens: int = 2048
    timeout_s: float = 120.0
    api_key: str | None = None  # sent as a Bearer token when set

    def replace(self, **changes) -> "LLMConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_config(cls, block) -> "LLMConfig":
        """From a config's llm_config() block; its api_key_env names the environment variable
        holding the key (a key itself never sits in a config, which runs record)."""
        key = os.environ.get(block.api_key_env) if block.api_key_env else None
        return cls(base_url=block.base_url, model=block.model, temperature=block.temperature,
                   max_tokens=block.max_tokens, timeout_s=block.timeout_s, api_key=key or None)


def chat(llm: LLMConfig, messages: list[dict]) -> str:
    """One chat completion from `llm`; returns choices[0].message.content. Raises LLMError."""
    url = endpoint(llm.base_url)
    timeout_s = llm.timeout_s
    body = json.dumps({"model": llm.model, "messages": messages,
                       "temperature": llm.temperature, "max_tokens": llm.max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    if llm.api_key:
        headers["Authorization"] = f"Bearer {llm.api_key}"
    for attempt in range(RETRIES + 1):
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read()
            break
        except urllib.error.HTTPError as err:
            head = err.read()[:500].decode("utf-8", errors="replace")
            raise LLMError(f"POST {url}: HTTP {err.code} {err.reason}: {head}") from err
        except (urllib.error.URLError, ConnectionError) as err:
            if attempt == RETRIES:
                reason = getattr(err, "reason", err)
                raise LLMError(f"POST {url}: cannot connect ({reason}) after "
                               f"{RETRIES + 1} attempts") from err
            time.sleep(0.5 * (attempt + 1))
        except TimeoutError as err:
            raise LLMError(f"POST {url}: no reply within {timeout_s:g} s") from err
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise LLMError(f"POST {url}: not an OpenAI chat completion: "
                       f"{raw[:500].decode('utf-8', errors='replace')!r}") from err
    if not isinstance(content, str):
        raise LLMError(f"POST {url}: choices[0].message.content is {type(content).__name__}, "
                       "not text")
    return content
