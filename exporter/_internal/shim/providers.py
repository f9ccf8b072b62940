"""The `provider` label of an SDK client (openai, aws.bedrock, vllm, ...), never a URL, and
the `gen_ai.provider.name` of its spans and GenAI metrics.

From the client's class (Azure, Bedrock, Vertex clients) or else its base URL host; cached per
(class, host), so naming costs a dict lookup per call. Where the OpenTelemetry GenAI
conventions have a well-known value for the provider (`azure.ai.openai`, `aws.bedrock`,
`gcp.vertex_ai`, `mistral_ai`, ...), the label is that value. `gen_ai.provider.name` is the
label for a known provider or serving engine, and otherwise (loopback, an IP, an internal or
unknown host) the API the SDK speaks (`openai`, `anthropic`): the instrumentation's best
knowledge, as the conventions ask.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Sequence

#: The GenAI conventions' well-known `gen_ai.provider.name` values: used wherever they apply.
WELL_KNOWN = frozenset({
    "anthropic", "aws.bedrock", "azure.ai.inference", "azure.ai.openai", "cohere", "deepseek",
    "gcp.gemini", "gcp.gen_ai", "gcp.vertex_ai", "groq", "ibm.watsonx.ai", "mistral_ai",
    "moonshot_ai", "openai", "perplexity", "x_ai",
})
_KNOWN_HOSTS = {
    "api.openai.com": "openai", "api.anthropic.com": "anthropic",
    "api.deepseek.com": "deepseek", "api.groq.com": "groq", "api.together.xyz": "together",
    "api.together.ai": "together", "api.fireworks.ai": "fireworks",
    "openrouter.ai": "openrouter", "api.mistral.ai": "mistral_ai", "api.x.ai": "x_ai",
    "generativelanguage.googleapis.com": "gcp.gemini", "api.perplexity.ai": "perplexity",
    "api.cohere.com": "cohere", "api.cohere.ai": "cohere", "api.moonshot.ai": "moonshot_ai",
    "api.moonshot.cn": "moonshot_ai", "api.cerebras.ai": "cerebras",
    "integrate.api.nvidia.com": "nvidia", "api.deepinfra.com": "deepinfra",
    "router.huggingface.co": "huggingface",
}
_SUFFIXES = ((".openai.azure.com", "azure.ai.openai"),
             (".services.ai.azure.com", "azure.ai.inference"),
             (".models.ai.azure.com", "azure.ai.inference"),
             (".inference.ai.azure.com", "azure.ai.inference"),
             (".azure.com", "azure.ai.openai"), (".azure-api.net", "azure.ai.openai"),
             (".amazonaws.com", "aws.bedrock"), ("aiplatform.googleapis.com", "gcp.vertex_ai"),
             (".ml.cloud.ibm.com", "ibm.watsonx.ai"))
_SERVERS = ("vllm", "sglang", "ollama", "llamacpp", "llama-cpp", "lmstudio", "litellm", "tgi",
            "triton", "localai")
#: Labels that name a provider or a serving engine (`gen_ai.provider.name` keeps them).
_NAMED = WELL_KNOWN | frozenset(_KNOWN_HOSTS.values()) | frozenset(
    s.replace("-", "") for s in _SERVERS)


def genai_provider(label: str, api: str) -> str:
    """`gen_ai.provider.name` of a call: the provider label when it names a provider or a
    serving engine, else `api`, the API the SDK speaks (openai, anthropic)."""
    return label if label in _NAMED else api
_INTERNAL_TLDS = frozenset({"local", "internal", "lan", "localdomain", "corp", "home", "intranet",
                            "cluster", "svc", "test", "localhost"})
_SECOND_LEVEL = frozenset({"co", "com", "net", "org", "ac", "gov", "edu"})
_NOT_LABEL = re.compile(r"[^a-z0-9_-]+")


class ClientProvider:
    """The provider label of an SDK's clients: from the class name (`by_class`: substring ->
    provider, e.g. azure.ai.openai, aws.bedrock), else from the base URL host (`default` where
    the host names none); cached per (class, host)."""

    def __init__(self, default: str, by_class: Sequence[tuple[str, str]]):
        self.default = default
        self.by_class = by_class
        self._cache: dict[tuple[type, str], str] = {}

    def __call__(self, client: Any) -> str:
        try:
            # The Stainless clients' own attribute, which their `base_url` property returns
            # (and openai's property runs an `import` statement on every read: ~1.5 µs a call).
            url = getattr(client, "_base_url", None)
            host = (client.base_url if url is None else url).host
        except Exception:
            host = ""
        key = (type(client), host)
        name = self._cache.get(key)
        if name is None:
            cls = type(client).__name__.lower()
            name = next((n for part, n in self.by_class if part in cls), None) \
                or provider_name(host, self.default)
            if len(self._cache) < 1024:
                self._cache[key] = name
        return name


def provider_name(host: str | None, default: str) -> str:
    """A short provider name from the base URL host: never a URL, never a port.

    Known API hosts map to their provider; hosts naming a serving engine (vllm, sglang, ...)
    to that engine; loopback to "local"; other IP addresses to "ip"; internal DNS names
    (`*.svc.cluster.local`, single labels) to their first label, the service; public names to
    their registrable label (`llm.example.com` -> "example").
    """
    if not host:
        return default
    host = host.lower().strip("[]").rstrip(".")
    if host in _KNOWN_HOSTS:
        return _KNOWN_HOSTS[host]
    for suffix, name in _SUFFIXES:
        if host.endswith(suffix):
            return name
    for server in _SERVERS:
        if server in host:
            return server.replace("-", "")
    if host == "localhost":
        return "local"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return "local" if address.is_loopback else "ip"
    labels = host.split(".")
    if len(labels) == 1 or labels[-1] in _INTERNAL_TLDS or "svc" in labels:
        pick = labels[0]
    elif len(labels) >= 3 and labels[-2] in _SECOND_LEVEL:
        pick = labels[-3]
    else:
        pick = labels[-2]
    return _NOT_LABEL.sub("-", pick)[:32].strip("-") or default
