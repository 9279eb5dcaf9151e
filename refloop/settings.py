"""The one settings object: every environment variable, validated at start-up."""

from __future__ import annotations

import functools
import hashlib
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from refloop.contract.approvals import APPROVAL_TIMEOUT_S
from refloop.contract.budget import DEFAULT_BUDGET_WAIT_S, ModelPrice, parse_prices
from refloop.contract.hosts import HOST_ID_PATTERN
from refloop.contract.messages import parse_max_tokens
from refloop.contract.window import parse_context_tokens

if TYPE_CHECKING:
    from refloop.contract.task import TaskInput


DEFAULT_TASK_QUEUE = "refloop"


def store_identity(database_url: str) -> str:
    """8 hex characters of the URL's sha256, its password left out (one store, whatever
    the secret)."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url).set(password=None)
    return hashlib.sha256(url.render_as_string().encode()).hexdigest()[:8]


class SettingsError(SystemExit):
    """Raised at start-up for an invalid variable; the message names the variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    # Temporal
    # `host:port` of a Temporal server, and its namespace; unset address: an embedded dev
    # server (`refloop up`, `refloop run`), else run `refloop worker` beside it
    temporal_address: str | None = None
    temporal_namespace: str = "default"
    # Unset: `refloop` with DATABASE_URL (workers of one database share it), else
    # `refloop-<store id>`, unique to the data dir's SQLite store (see `task_queue`)
    refloop_task_queue: str | None = None
    # Hosts (refloop/contract/hosts.py): this worker's host id; how often it records itself
    # in the hosts table (live: a beat within 3 intervals); how long a task's workspace call
    # may wait for a worker of its host before the task shows `waiting_for_host`.
    refloop_host_id: str = Field(default_factory=socket.gethostname, pattern=HOST_ID_PATTERN)
    refloop_host_heartbeat_s: float = Field(default=10.0, gt=0)
    refloop_host_wait_s: float = Field(default=60.0, gt=0)
    # The embedded dev server (TEMPORAL_ADDRESS unset): its gRPC and Web UI ports on
    # 127.0.0.1 (flags `--temporal-port`, `--ui-port`)
    refloop_temporal_port: int = Field(default=7233, gt=0, lt=65536)
    # true (and `up --temporal-port`): that port or a clear failure, never another port
    # (by default a port another process holds is left for free ones, saying so)
    refloop_temporal_port_pinned: bool = False
    refloop_ui_port: int = Field(default=8233, gt=0, lt=65536)
    # The scripted offline model's port on 127.0.0.1 when OPENAI_BASE_URL is unset (flag
    # `up --scripted-port`; 0: a free one)
    refloop_scripted_port: int = Field(default=0, ge=0, lt=65536)
    # The API's port (`refloop up`, `refloop api`; flag `--port`)
    refloop_api_port: int = Field(default=8000, gt=0, lt=65536)
    # The Temporal Web UI's address, for the console's links to a task's history (unset:
    # the embedded server's, under `refloop up`; none with an outside server)
    refloop_temporal_ui_url: str | None = None
    # `refloop up` restarts its embedded server when it dies, at most this often in 10 min;
    # past that it exits non-zero (0: exit at the first death)
    refloop_temporal_restarts: int = Field(default=3, ge=0, le=100)
    # SIGTERM/SIGINT: in-flight activities get this long to finish before the worker stops
    refloop_graceful_shutdown_s: float = Field(default=10.0, ge=0)
    # Persistence; unset: SQLite file under the data dir
    database_url: str | None = None
    # `refloop up`/`api` wait this long for an unreachable database, then exit 2
    refloop_database_wait_s: float = Field(default=30.0, ge=0, le=3600)
    # Metrics (refloop/runtime/metrics.py): a Prometheus scrape endpoint, host:port (else
    # OTLP when OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT is set); task gauges counted this often
    refloop_metrics_address: str | None = None
    refloop_metrics_every_s: float = Field(default=15.0, gt=0)
    refloop_data_dir: Path = Path(".refloop-data")
    # LLM; unset base URL: the scripted offline model
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    refloop_model: str = "scripted"
    refloop_review_model: str | None = None
    # One model request's time bound, streamed or not (refloop/llm/stream.py)
    refloop_llm_timeout_s: float = Field(default=120.0, gt=0)
    # A streamed answer that began and then sends no token for this long has stalled
    refloop_llm_idle_timeout_s: float = Field(default=30.0, gt=0)
    # auto: requests stream (refloop counts the tokens and hangs up at max_tokens), unless
    # the endpoint turns out unable to; off: never (the server alone keeps max_tokens)
    refloop_llm_stream: Literal["auto", "off"] = "auto"
    # Re-asks of an invalid structured (JSON) answer before a clear failure
    refloop_structured_max_reasks: int = Field(default=2, ge=0, le=10)
    # A model endpoint that fails in a way it may recover from (refused, reset, timed out,
    # 5xx, 429, 401/403, a garbled answer) is waited out for this long per call, the task
    # `waiting_for_model`; then the task fails naming the endpoint. Default 6 hours.
    refloop_model_outage_s: float = Field(default=6 * 3600.0, gt=0)
    # A refused key (HTTP 401/403) is waited out this long at most (a key being rotated),
    # not the whole outage bound: past it the call fails, naming the endpoint.
    refloop_model_auth_wait_s: float = Field(default=300.0, gt=0)
    # Model prices, JSON: model name to {"input_usd_per_mtok": X, "output_usd_per_mtok": Y}
    # (USD per million tokens; a model config may carry its own). Each answered call is
    # priced from the usage its endpoint reports; a model with no price is counted in
    # tokens only, and tasks say so.
    refloop_model_prices: str | None = None
    # A task or code review at its spend limit (`max_cost_usd`, `max_tokens`) waits
    # `waiting_for_budget` this long for a raise (`refloop budget`), then ends incomplete.
    # Default 7 days.
    refloop_budget_wait_s: float = Field(default=DEFAULT_BUDGET_WAIT_S, gt=0)
    # The build of the workflow code this worker runs (unset: a digest of the code); a
    # task handed over by one build is taken over by a worker of another (`refloop drain`).
    refloop_build_id: str | None = Field(default=None, min_length=1, max_length=128)
    # How often a worker looks for tasks another build handed over (and at its start).
    refloop_take_over_every_s: float = Field(default=15.0, gt=0)
    # While an endpoint is down, one request per worker probes it, at most this far apart
    # (backing off from an eighth of it; a longer Retry-After is honoured); the other calls
    # are parked in their tasks and woken once it answers (else they recheck after twenty
    # times this, doubling up to 5 minutes).
    refloop_model_probe_s: float = Field(default=3.0, gt=0)
    # Endpoint capabilities (refloop.llm.endpoint): auto negotiates and remembers per
    # (base URL, model); a pinned value is used as is.
    refloop_structured_mode: Literal["auto", "json_schema", "json_object_schema",
                                     "json_object", "prompt"] = "auto"
    refloop_tool_mode: Literal["auto", "native", "text"] = "auto"
    refloop_tool_choice: str = "auto"  # auto | required | none | a tool name
    # Completion cap: one number for every purpose, or "act=2048,plan=1024" overrides
    refloop_max_tokens: str | None = None
    # The model's context window in tokens: one number for every model, or
    # "smollm2=4096,gpt-4o=128000" per model. Unset: the endpoint's word (llama.cpp's
    # /props, /v1/models), its first refusal of a longer prompt, else the default below.
    refloop_model_context_tokens: str | None = None
    # The window assumed while nothing else says (conservative: a refusal teaches a
    # smaller one, nothing teaches a larger one)
    refloop_model_context_default: int = Field(default=8192, ge=1024)
    # Compaction (docs/models.md): past this share of the prompt's room old tool outputs
    # are masked to a line each; past the second, the older turns are summarised by the
    # model (purpose `compact`).
    refloop_compact_mask_at: float = Field(default=0.6, gt=0, le=1)
    refloop_compact_summary_at: float = Field(default=0.75, gt=0, le=1)
    # Model requests in flight per endpoint on this worker (0: no limit; 1 for llama.cpp)
    refloop_llm_concurrency: int = Field(default=0, ge=0)
    # Model calls a second for the whole fleet: the Temporal server's rate limit on the model
    # task queue (unset: none)
    refloop_llm_rate_per_s: float | None = Field(default=None, gt=0)
    # Worker: 0 turns off sticky workflow caching (each task replays its history).
    refloop_worker_max_cached_workflows: int = Field(default=1000, ge=0)
    # Admission (docs/operations.md): activities, and workflow tasks, one worker runs at
    # once on each of its task queues; the rest wait in Temporal's queue, where a wait
    # costs no heartbeat and no retry. 0: sized to the CPUs this process may use (16
    # activities and 2 workflow tasks a CPU). Workflow tasks: at least 2 (sticky and not).
    refloop_worker_max_activities: int = Field(default=0, ge=0)
    refloop_worker_max_workflow_tasks: int = Field(default=0, ge=0)
    # Off: workflows run without Temporal's sandbox (about 1.4x the task throughput); the
    # tests always run sandboxed and replay the golden histories, which is what keeps
    # workflow code deterministic.
    refloop_workflow_sandbox: bool = True
    # API
    # Bearer token of the HTTP API, its console and `/mcp`; unset and bound off loopback,
    # `refloop up`/`api` generate one and print the console's address with it
    refloop_api_token: str | None = None
    # Host names the API answers for besides loopback ones (comma-separated; `*`: any, for
    # a proxy that checks them). Any other Host header gets 421 (DNS rebinding).
    refloop_allowed_hosts: str | None = None
    # Slow clients: a request's headers must arrive within this many seconds, its body
    # within the next; an idle keep-alive connection closes after the last.
    refloop_http_header_timeout_s: float = Field(default=10.0, gt=0)
    refloop_http_body_timeout_s: float = Field(default=30.0, gt=0)
    refloop_http_keep_alive_s: float = Field(default=5.0, ge=1)
    # Directories API tasks may work in (comma or os.pathsep separated); unset: the
    # server's start directory and <data dir>/workspaces (see refloop.runtime.workspaces)
    refloop_workspace_roots: str | None = None
    # Seconds: a fresh session workspace still empty this long is removed (a later
    # task of the session makes it again)
    refloop_session_ttl: float = Field(default=3600.0, gt=0)
    # How long a call waits for a person's approval, in seconds (default 3 days), unless
    # the task or its session says otherwise; unanswered, the task ends incomplete.
    refloop_approval_timeout_s: float = Field(default=APPROVAL_TIMEOUT_S, gt=0)
    # Completeness reflection
    # The check at a task's end: on or off; supplement actions it may ask for, rounds; the
    # judge's model (unset: the task's), temperature, top_p and re-asks
    enable_reflection: bool = True
    reflection_max_supplements: int = Field(default=3, ge=0, le=10)
    reflection_max_rounds: int = Field(default=2, ge=1, le=5)
    reflection_fc_model: str | None = None
    fc_reflection_temperature: float = Field(default=0.2, ge=0.0, le=2.0)
    fc_reflection_top_p: float = Field(default=0.9, gt=0.0, le=1.0)
    fc_reflection_max_retries: int = Field(default=2, ge=0, le=10)
    # Task-type tool constraints; unset: the shipped refloop/task_rules.yaml
    refloop_task_rules: str | None = None
    # A JSON file in the `mcpServers` shape: the MCP tool servers tasks may choose.
    refloop_mcp_config: str | None = None
    # Tools
    # Tool limits: bytes a read returns, bytes of a command's output kept, a command's
    # seconds
    refloop_max_read_bytes: int = Field(default=200_000, gt=0)
    refloop_max_output_bytes: int = Field(default=20_000, gt=0)
    refloop_cmd_timeout_s: float = Field(default=60.0, gt=0)
    # Strings larger than this go to the blob store; histories carry a marker (history-lean)
    refloop_blob_threshold_bytes: int = Field(default=2048, ge=256)
    # Semantic search (`refloop[semantic]`): index each task's workspace in the background;
    # unset dir: <data dir>/index (LanceDB). Point it at shared storage for several workers.
    refloop_semantic_index: bool = True
    refloop_index_dir: Path | None = None
    # The embedding model of search_semantic: all-MiniLM-L6-v2 as int8 ONNX (fast to load)
    # or its PyTorch build; each has its own index.
    refloop_embedding_model: Literal["minilm-int8", "minilm"] = "minilm-int8"
    # Your own OpenAI-compatible embeddings endpoint (OpenAI's, Ollama's, llama.cpp's, a TEI
    # server: ".../v1" or ".../v1/embeddings"), used instead of the packaged model when set;
    # REFLOOP_EMBEDDINGS_MODEL is the model name it is asked for (its index is its own).
    refloop_embeddings_url: str | None = None
    refloop_embeddings_model: str = Field(default="all-MiniLM-L6-v2", min_length=1)
    refloop_embeddings_api_key: str | None = None  # sent to that endpoint only
    refloop_embeddings_concurrency: int = Field(default=4, ge=1, le=64)  # requests at once
    # Texts per request, and one request's time bound (a CPU-bound local server may need
    # smaller batches or more time)
    refloop_embeddings_batch_size: int = Field(default=32, ge=1, le=2048)
    refloop_embeddings_timeout_s: float = Field(default=60.0, gt=0)
    # What the endpoint's model wants before a search and before a document, for models
    # trained with prefixes (e5: "query: " and "passage: "; nomic: "search_query: " and
    # "search_document: "; bge and arctic: a query instruction), and/or the `input_type`
    # sent with each request (Cohere: search_query and search_document; Voyage: query and
    # document; NVIDIA: query and passage); unset: none
    refloop_embeddings_query_prefix: str = ""
    refloop_embeddings_document_prefix: str = ""
    refloop_embeddings_query_input_type: str | None = None
    refloop_embeddings_document_input_type: str | None = None
    # The endpoint model's window in tokens: chunks are cut to fit it, its document prefix
    # included (default all-MiniLM-L6-v2's 256; e5, bge and arctic take 512, nomic 8192).
    # Changing it, or the document prefix or input type, builds a new index.
    refloop_embeddings_window_tokens: int = Field(default=256, ge=32, le=1_000_000)
    # Embedding threads of an index pass (0: one per CPU the pass may use). The pass runs at
    # lower priority, so the worker's own threads keep first call on the CPUs.
    refloop_index_threads: int = Field(default=0, ge=0, le=256)
    # System prompt's repo map budget, in tokens (0: no map)
    refloop_repo_map_tokens: int = Field(default=1024, ge=0, le=32_000)
    # Variables a model config may name for its key, each bound to the base URLs its key may
    # go to: "TEAM_KEY=https://llm.example/v1,TEAM_KEY=https://b.example/v1" (a name may
    # repeat; a bare NAME may go only to the worker's own OPENAI_BASE_URL). Unset: none. A
    # config with its own base URL and no allowed key variable gets no key at all.
    refloop_model_key_envs: str | None = None
    # Allowlist mode for run_cmd: comma-separated first words (e.g. "pytest,ls,cat"); unset: off
    refloop_cmd_allowlist: str | None = None
    # Command sandbox: bwrap (default; an error when bubblewrap cannot run) or none (explicit,
    # unconfined, loudly warned). Extra read-only paths a command may need (a toolchain
    # outside /usr), comma-separated. Limits: memory (tmpfs included) and processes per
    # command as a whole where the worker may make cgroups, else per process (setrlimit).
    refloop_sandbox: Literal["bwrap", "none"] | None = None
    refloop_sandbox_ro_paths: str | None = None
    refloop_cmd_memory_mb: int = Field(default=8192, ge=64)
    refloop_cmd_file_mb: int = Field(default=1024, ge=1)
    refloop_cmd_max_processes: int = Field(default=4096, ge=8)
    # The host uid and gid a root worker's commands run as when the workspace belongs to
    # root (a workspace owned by an ordinary user runs its commands as that user); root's
    # files in the workspace are handed to them first. Never 0.
    refloop_cmd_uid: int = Field(default=65534, ge=1)
    refloop_cmd_gid: int = Field(default=65534, ge=1)
    # Workspace checkpoints: a file larger than this is left out (and said so)
    refloop_checkpoint_file_mb: int = Field(default=10, ge=1)
    # Where checkpoint content and manifests are stored, read by every host: unset, the
    # database (its `checkpoint_objects` table); `s3://BUCKET[/PREFIX]`, an S3-compatible
    # bucket (the `s3` extra: boto3). Credentials come from the usual AWS chain
    # (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance role), never
    # from here. Checkpoints taken before a switch stay in the old store (see Operations).
    refloop_checkpoint_store: str | None = None
    # The bucket's endpoint URL when it is not AWS (MinIO, Ceph, R2...), its region, and
    # how the bucket is addressed (`path` for most S3-compatible servers)
    refloop_checkpoint_s3_endpoint: str | None = None
    refloop_checkpoint_s3_region: str | None = None
    refloop_checkpoint_s3_addressing: Literal["auto", "path", "virtual"] = "auto"
    # Largest content a write or edit may produce (E_TOO_LARGE past it)
    refloop_max_write_bytes: int = Field(default=10 * 1024 * 1024, gt=0)
    # The edit journal (idempotent edits, undo); unset: <data dir>/journal. Point it at
    # storage every worker shares, never inside a workspace.
    refloop_journal_dir: Path | None = None

    @property
    def search_model(self) -> str:
        """The embedding model search_semantic and the index use: the endpoint's
        ("api:NAME") when REFLOOP_EMBEDDINGS_URL is set, else the packaged one."""
        if self.refloop_embeddings_url:
            return f"api:{self.refloop_embeddings_model}"
        return self.refloop_embedding_model

    @property
    def search_model_env(self) -> dict[str, str]:
        """What an index pass (and this process's embedder) needs to reach the endpoint."""
        if not self.refloop_embeddings_url:
            return {}
        # Every REFLOOP_EMBEDDINGS_* setting the operator gave (the rest keep defaults)
        return {name.upper(): str(value) for name, value in self.model_dump(
            include={n for n in type(self).model_fields if n.startswith("refloop_embeddings_")},
            exclude_defaults=True).items() if value is not None}

    @property
    def journal_dir(self) -> Path:
        return self.refloop_journal_dir or self.refloop_data_dir / "journal"

    @property
    def sandbox_ro_paths(self) -> list[str]:
        return [p.strip() for p in (self.refloop_sandbox_ro_paths or "").split(",") if p.strip()]

    @property
    def model_key_envs(self) -> frozenset[str]:
        return frozenset(self.model_key_urls)

    @property
    def model_key_urls(self) -> dict[str, frozenset[str]]:
        """Each key variable -> the normalised base URLs its key may go to (DEFAULT_ENDPOINT:
        the worker's own OPENAI_BASE_URL)."""
        return parse_model_key_envs(self.refloop_model_key_envs)

    def key_refusal(self, api_key_env: str | None, base_url: str | None) -> str | None:
        """Why a model config may not pair this key variable with this base URL, or None.
        The API refuses such a config (422); the worker refuses to send the key."""
        if not api_key_env:
            return None
        allowed = self.model_key_urls.get(api_key_env)
        if allowed is None:
            return f"{api_key_env} is not in REFLOOP_MODEL_KEY_ENVS"
        default = normalise_url(self.openai_base_url) if self.openai_base_url else None
        target = normalise_url(base_url) if base_url else default
        if target is None and DEFAULT_ENDPOINT in allowed:
            return None
        if target in allowed or (DEFAULT_ENDPOINT in allowed and target == default):
            return None
        return (f"{api_key_env} may not be sent to {(base_url or 'the default endpoint')[:80]}"
                " (REFLOOP_MODEL_KEY_ENVS binds it to other base URLs)")

    @property
    def cmd_allowlist(self) -> list[str] | None:
        if not self.refloop_cmd_allowlist:
            return None
        return [word.strip() for word in self.refloop_cmd_allowlist.split(",") if word.strip()]

    @field_validator("temporal_address", "openai_base_url", "database_url", "openai_api_key")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value or None

    @field_validator("temporal_address")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            host, _, port = value.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError("must be host:port, e.g. localhost:7233")
        return value

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("sqlite", "postgresql")):
            raise ValueError("must be a sqlite:// or postgresql+psycopg:// URL")
        return value

    @field_validator("refloop_checkpoint_store")
    @classmethod
    def _checkpoint_store(cls, value: str | None) -> str | None:
        if value:
            parse_s3_url(value)
        return value or None

    @field_validator("refloop_model_key_envs")
    @classmethod
    def _key_bindings(cls, value: str | None) -> str | None:
        parse_model_key_envs(value)
        return value or None

    @field_validator("refloop_worker_max_workflow_tasks")
    @classmethod
    def _two_workflow_tasks(cls, value: int) -> int:
        if value == 1:
            raise ValueError("must be 0 (sized to the CPUs) or at least 2: a worker polls "
                             "its sticky and its shared workflow queue at once")
        return value

    @field_validator("refloop_max_tokens", "refloop_model_context_tokens")
    @classmethod
    def _number_or_pairs(cls, value: str | None, info: ValidationInfo) -> str | None:
        """One number, or name=N pairs: parsed at start, so a bad one fails naming itself."""
        if value:
            (parse_max_tokens if info.field_name == "refloop_max_tokens"
             else parse_context_tokens)(value)
        return value or None

    @field_validator("refloop_model_prices")
    @classmethod
    def _prices(cls, value: str | None) -> str | None:
        try:
            parse_prices(value)
        except ValueError as err:  # a JSON error is a ValueError too
            raise ValueError(f"model prices: {err}") from None
        return value or None

    @functools.cached_property
    def model_prices(self) -> dict[str, ModelPrice]:
        """REFLOOP_MODEL_PRICES, by model name."""
        return parse_prices(self.refloop_model_prices)

    def review_model(self, requested: str | None = None) -> str:
        """Quality review and code review: the operator's review model, else the one the
        task asked for, else the default."""
        return self.refloop_review_model or requested or self.refloop_model

    def reflection_model(self, requested: str | None = None) -> str:
        """The completeness judge: the operator's reflection model, else the task's, else
        the default."""
        return self.reflection_fc_model or requested or self.refloop_model

    def task_input(self, *, enable_reflection: bool | None = None,
                   **fields: Any) -> TaskInput:
        """A task as the CLI and the API start it: the operator's reflection settings
        under what the caller chose (`enable_reflection` None: the operator's default)."""
        from refloop.contract.task import TaskInput

        if fields.get("host"):  # the operator's bound on waiting for the task's host
            fields.setdefault("host_wait_s", self.refloop_host_wait_s)
        if fields.get("approval_timeout_s") is None:  # neither the task nor its session
            fields["approval_timeout_s"] = self.refloop_approval_timeout_s
        if fields.get("max_cost_usd") or fields.get("max_tokens"):  # and for a raise
            fields.setdefault("budget_wait_s", self.refloop_budget_wait_s)
        return TaskInput(
            enable_reflection=self.enable_reflection if enable_reflection is None
            else enable_reflection,
            reflection_max_supplements=self.reflection_max_supplements,
            reflection_max_rounds=self.reflection_max_rounds,
            **fields,
        )

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        self.refloop_data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.refloop_data_dir / 'refloop.db').resolve()}"

    @property
    def store_id(self) -> str:
        """The store's identity, announced by workers: a hash of DATABASE_URL without its
        password, or of the SQLite file's path."""
        return store_identity(self.effective_database_url)

    @property
    def task_queue(self) -> str:
        """Workers of different stores never share a queue (a task's rows and blobs would
        split between them): without DATABASE_URL the store is the data dir's SQLite file,
        so the default queue is the data dir's own, even on a shared Temporal server."""
        if self.refloop_task_queue:
            return self.refloop_task_queue
        return DEFAULT_TASK_QUEUE if self.database_url else \
            f"{DEFAULT_TASK_QUEUE}-{self.store_id}"

    @property
    def index_dir(self) -> Path:
        return self.refloop_index_dir or self.refloop_data_dir / "index"

    @property
    def uses_scripted_model(self) -> bool:
        return self.openai_base_url is None


DEFAULT_ENDPOINT = ""  # a bare NAME in REFLOOP_MODEL_KEY_ENVS: the worker's own endpoint
KEY_ENV_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def normalise_url(url: str) -> str:
    """Scheme and host lower-cased, no trailing slash: one spelling per endpoint."""
    parts = urlsplit(url.strip())
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"),
                       parts.query, ""))


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, key prefix) of `s3://BUCKET[/PREFIX]`; the prefix ends with "/" unless
    empty."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"{url[:80]!r} is not s3://BUCKET[/PREFIX]")
    bucket = parts.netloc
    if not (3 <= len(bucket) <= 63) or not all(c.isalnum() or c in ".-" for c in bucket):
        raise ValueError(f"{bucket[:80]!r} is not a bucket name")
    prefix = parts.path.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise ValueError(f"{url[:80]!r}: the prefix has an empty, '.' or '..' part")
    return bucket, f"{prefix}/" if prefix else ""


def parse_model_key_envs(raw: str | None) -> dict[str, frozenset[str]]:
    """"NAME=URL,NAME=URL2,OTHER" -> {NAME: {URL, URL2}, OTHER: {DEFAULT_ENDPOINT}}."""
    bound: dict[str, set[str]] = {}
    for entry in (raw or "").split(","):
        name, sep, url = (part.strip() for part in entry.partition("="))
        if not name:
            continue
        if not KEY_ENV_RE.match(name):
            raise ValueError(f"{name[:40]!r} is not a variable name")
        if sep and not url.startswith(("http://", "https://")):
            raise ValueError(f"{name}'s base URL must start with http:// or https://")
        bound.setdefault(name, set()).add(normalise_url(url) if sep else DEFAULT_ENDPOINT)
    return {name: frozenset(urls) for name, urls in bound.items()}


def load_settings() -> Settings:
    """Build settings from the environment, turning validation errors into one clear message."""
    try:
        return Settings()
    except ValidationError as exc:
        lines = [
            f"  {str(err['loc'][0]).upper()}: {err['msg']} (got {err.get('input')!r})"
            for err in exc.errors()
        ]
        raise SettingsError("invalid configuration:\n" + "\n".join(lines)) from None


@functools.cache
def get_settings() -> Settings:
    return load_settings()
