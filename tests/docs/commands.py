"""Every shell command the README and docs/ show, and how the tests run each one.

A page's shell blocks (fenced `sh`, `bash`, `shell` or `console`) are cut into commands as
bash reads them: a line ending in a backslash, an open quote or an open `{` group goes on.
Each command is either run by a test (EXPECT: its exit status and a part of its output,
through `DocShell`, in a bash that keeps `cd`, `export` and functions between the commands
of a page, as a reader's terminal would) or listed in EXCLUDED with the reason it is not.
`tests/docs/test_doc_commands.py` fails on a command that is in neither.
"""

from __future__ import annotations

import os
import re
import selectors
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_FENCES = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass(frozen=True)
class DocCommand:
    page: str  # relative to the repository: README.md, docs/temporal.md
    line: int  # the command's first line on the page
    text: str  # as shown (indentation of its block removed), comments included

    @property
    def key(self) -> str:
        """The command's words as bash splits them, comments dropped: the tables' key."""
        return key_of(self.text)


def key_of(text: str) -> str:
    """Bash's words, a backslash-newline removed as bash removes it; every run of white
    space (in quotes too) one space."""
    return " ".join(" ".join(shlex.split(text.replace("\\\n", ""), comments=True)).split())


def pages() -> list[str]:
    return ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def blocks(page: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, first line, lines) of each fenced block of the page."""
    lines = (ROOT / page).read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, language = len(opened.group(1)), opened.group(2)
        body, j = [], i + 1
        while j < len(lines) and not FENCE.match(lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        yield language, i + 2, body
        i = j + 1


def complete(text: str) -> bool:
    """Whether bash would run `text` now rather than read another line."""
    if text.endswith("\\"):
        return False
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # an open quote
        return False
    return words.count("{") <= words.count("}")  # no `{ ...` group left open


def commands(page: str) -> list[DocCommand]:
    found = []
    for language, first, body in blocks(page):
        if language not in SHELL_FENCES:
            continue
        pending: list[str] = []
        start = first
        for number, line in enumerate(body, first):
            if not pending:
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                start = number
            pending.append(line)
            text = "\n".join(pending)
            if complete(text):
                found.append(DocCommand(page, start, text))
                pending = []
        assert not pending, f"{page}:{start}: a command that never ends: {pending}"
    return found


def every_command() -> list[DocCommand]:
    return [command for page in pages() for command in commands(page)]


@dataclass(frozen=True)
class Expect:
    contains: str  # in stdout or stderr
    status: int = 0


# Commands a test runs: what each must print (stdout or stderr) and its exit status. The
# test that runs a page's commands is in RUN_BY.
EXPECT: dict[str, Expect] = {
    # README.md, docs/index.md, docs/quick-start.md: the offline demo, on a fresh data dir
    "make demo": Expect("/namespaces/default/workflows/task-"),
    # docs/temporal.md: the stock CLI against the tests' dev server (TEMPORAL_ADDRESS)
    "temporal workflow start --type AgentTaskWorkflow --task-queue refloop-3fa9c2e1 "
    "--workflow-id report-1 --static-summary write report.md --input "
    '{"task": "write a short report as report.md", "workspace": "/abs/path/ws", '
    '"approval_mode": "confirm_writes"}': Expect("Running execution:"),
    "temporal workflow query --workflow-id report-1 --name events --input 0":
        Expect("approval_required"),
    "temporal workflow query --workflow-id report-1 --name progress":
        Expect("waiting_approval"),
    "temporal workflow metadata --workflow-id report-1": Expect("decide_approval"),
    "temporal workflow update execute --workflow-id report-1 --name decide_approval "
    '--input {"call_id": "1.0", "approved": true}': Expect("approved"),
    "temporal workflow list --query RefloopStatus='completed'": Expect("report-1"),
    "temporal workflow list --query "
    "RefloopStatus='waiting_approval' AND RefloopKind='agent_task'": Expect("report-1"),
    "temporal workflow show --workflow-id report-1 -o json > report-1.json": Expect(""),
    "refloop replay report-1.json": Expect("1 history replayed cleanly"),
    # docs/http-api.md: curl against `refloop up` (its port for 8000)
    "curl -s -XPOST localhost:8000/agent/interactive/start -H content-type: application/json "
    '-d {"workspace": "/path/to/ws", "enable_quality_review": true, '
    '"quality_review_rules": "Every report needs a Summary section."}':
        Expect('"session_id":"sess-'),
    "curl -N -XPOST localhost:8000/agent/interactive/task/stream -H "
    'content-type: application/json -d {"session_id": "sess-...", "task": "write report.md"}':
        Expect("event: completed"),
    "curl -s -XPOST localhost:8000/tasks -H content-type: application/json -d "
    '{"workspace": "/path/to/ws", "task": "write report.md", "approval_mode": "auto"}':
        Expect('"session_id":"sess-'),
    # docs/operations.md: a task waiting for its second approval, sent back to step 1
    "refloop rewind TASK --to-step N": Expect("rewound to step 1"),
    "refloop fork TASK --at-step N --task write c.txt instead of b.txt":
        Expect("forked from"),
    "refloop drain": Expect("asked to hand over"),
    # docs/cli.md: the everyday commands beside `refloop up`, on a task waiting for approval
    "refloop tasks": Expect("waiting_approval"),
    "refloop inbox": Expect("approval of call 1.0: write_file"),
    "refloop show TASK": Expect("waits for: approval of call 1.0"),
    "refloop approve TASK": Expect("call 1.0 approved"),
    'refloop approve TASK --arguments {"path": "a.txt", "content": "a.txt, as I want it"}':
        Expect("call 1.0 approved with your arguments"),
    "refloop reject TASK CALL --reason keep b.txt as it is": Expect("rejected"),
    "refloop watch TASK": Expect(": completed"),
    "refloop cancel TASK": Expect("cancelling"),
    "refloop tasks --status waiting_approval --json": Expect('"status":"waiting_approval"'),
    # docs/mcp.md: mcp-server-git is a test dependency; the page's mcp.json, a git repo
    "pip install mcp-server-git": Expect("Requirement already satisfied: mcp-server-git"),
    "export REFLOOP_MCP_CONFIG=mcp.json": Expect(""),
    "refloop run Summarise the last five commits of this repository "
    "--workspace ~/src/myrepo --mcp git": Expect("git__git_log"),
    # docs/deploying.md: the certificates, in a temporary directory
    "mkdir -p certs && cd certs": Expect(""),
    "openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj /CN=refloop-ca "
    "-keyout ca.key -out ca.crt": Expect(""),
    'sign() { openssl req -newkey rsa:3072 -nodes -subj /CN=$1 -keyout $1.key -out $1.csr '
    "printf subjectAltName=%s\\nextendedKeyUsage=%s\\n $2 ${3:-serverAuth} > $1.ext "
    "openssl x509 -req -in $1.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
    "-days 825 -extfile $1.ext -out $1.crt }": Expect(""),
    "sign temporal DNS:refloop-fleet": Expect("subject=CN = temporal"),
    "sign server IP:10.0.0.1,DNS:fleet.example": Expect("subject=CN = server"),
    "sign worker DNS:worker-c clientAuth": Expect("subject=CN = worker"),
}

# The page whose commands each test runs, so a page's new command has a home.
RUN_BY = {
    "README.md": "tests/docs/test_doc_commands.py::test_make_demo",
    "docs/index.md": "tests/docs/test_doc_commands.py::test_make_demo",
    "docs/quick-start.md": "tests/docs/test_doc_commands.py::test_make_demo",
    "docs/temporal.md":
        "tests/e2e/test_temporal_cli.py::test_the_temporal_cli_drives_a_task_end_to_end",
    "docs/http-api.md": "tests/docs/test_doc_commands.py::test_http_api_and_rewind",
    "docs/cli.md": "tests/docs/test_doc_commands.py::test_everyday_commands",
    "docs/operations.md": "tests/docs/test_doc_commands.py::test_http_api_and_rewind",
    "docs/mcp.md": "tests/docs/test_doc_commands.py::test_mcp_git_server",
    "docs/deploying.md": "tests/docs/test_doc_commands.py::test_certificates",
}

DOCKER = "needs a Docker engine and images (the compose files are checked by " \
    "tests/unit/deployment without one)"
REAL_MODEL = "needs a real model endpoint; `make test-real-model` (tests/real_model) runs " \
    "refloop on a local llama.cpp server"

# Commands no test runs, each with the reason. Review an entry before adding it.
S3 = ("needs an S3-compatible server; tests/unit/checkpoints/test_s3_store.py runs the "
      "same settings against moto's server")

BUDGET = ("a spend limit's commands name a task waiting for budget (TASK); "
          "tests/e2e/test_budget_cli.py prices a scripted model this way and runs "
          "`refloop budget` and the stock CLI's `raise_budget` update on such a task, "
          "tests/api/test_budget.py POST /tasks/{id}/budget")
EXCLUDED: dict[str, str] = {
    'export REFLOOP_MODEL_PRICES={"gpt-4o": {"input_usd_per_mtok": 2.5, '
    '"output_usd_per_mtok": 10}}': BUDGET,
    "refloop budget TASK --max-cost-usd 5": BUDGET,
    'curl -X POST localhost:8000/tasks/TASK/budget -H content-type: application/json '
    '-d {"max_cost_usd": 5.0}': BUDGET,
    "temporal workflow update execute --workflow-id TASK --name raise_budget --input "
    '{"max_cost_usd": 5.0}': BUDGET,
    "pip install refloop[s3]": S3,
    "export REFLOOP_CHECKPOINT_STORE=s3://my-bucket/refloop/checkpoints": S3,
    "export REFLOOP_CHECKPOINT_S3_ENDPOINT=http://minio:9000": S3,
    "export REFLOOP_CHECKPOINT_S3_ADDRESSING=path": S3,
    "export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...": S3,
    "make test": "the suite itself, which runs this test",
    "refloop up --port 8100 --temporal-port 7300 --ui-port 8300": "runs until Ctrl-C, on "
        "ports other servers here may hold; tests/e2e/test_cli_people.py starts `refloop "
        "up` with these three flags on free ports and reads the addresses it prints",
    "make soak MINUTES=40": "40 minutes; the soak (`make soak`) is its own target",
    "python -m bench.soak --minutes 3 --short": "3 minutes: longer than the whole docs "
        "check; tests/e2e/test_soak.py runs the soak's short form with its own bounds",
    "sudo chown 999:999 server.key && sudo chmod 600 server.key":
        "changes a file's owner to the PostgreSQL image's user: needs root and that user",
    "REFLOOP_API_TOKEN=... REFLOOP_DB_PASSWORD=... REFLOOP_FLEET_ADDRESS=10.0.0.1 "
    "REFLOOP_POSTGRES_ADDRESS=10.0.0.1 REFLOOP_POSTGRES_SSL=on docker compose "
    "--profile fleet up -d": DOCKER,
    "REFLOOP_FLEET_ADDRESS=10.0.0.1 REFLOOP_HOST_ID=c REFLOOP_DB_PASSWORD=... "
    "OPENAI_BASE_URL=... OPENAI_API_KEY=... docker compose -f docker-compose.host.yml up -d":
        DOCKER,
    "docker compose -f docker-compose.host.yml cp ./repo "
    "worker:/home/refloop/data/workspaces/repo": DOCKER,
    "curl -H Authorization: Bearer $REFLOOP_API_TOKEN -H Content-Type: application/json "
    '-d {"workspace": "/home/refloop/data/workspaces/repo", "host": "c"} '
    "http://127.0.0.1:8000/agent/interactive/start": "needs the compose fleet of the "
        "commands above (host c); the same route is run by docs/http-api.md's commands",
    "curl -H Authorization: Bearer $REFLOOP_API_TOKEN -H Content-Type: application/json "
    '-d {"session_id": "<session id>", "task": "add a README section on tests"} '
    "http://127.0.0.1:8000/agent/interactive/task": "needs the compose fleet; the same "
        "route is run by docs/http-api.md's commands",
    "export OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... "
    "REFLOOP_MODEL=gpt-4o-mini": "needs an OpenAI key",
    "refloop run add a docstring to every function in util.py --workspace ./repo":
        "runs on the OpenAI endpoint the command above sets: needs a key",
    "pip install llama-cpp-python[server]==0.3.36": REAL_MODEL + " (a 9-minute build)",
    "python -m llama_cpp.server --model SmolLM2-135M-Instruct.Q4_1.gguf --model_alias "
    "smollm2 --n_ctx 8192 --chat_format chatml-function-calling --port 8080": REAL_MODEL,
    "export OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=none "
    "REFLOOP_MODEL=smollm2": REAL_MODEL,
    "export REFLOOP_LLM_CONCURRENCY=1 REFLOOP_LLM_TIMEOUT_S=90": REAL_MODEL,
    "refloop run Create hello.txt containing hi --workspace ./ws": REAL_MODEL,
    "ollama pull qwen2.5:0.5b": "needs Ollama and a model download",
    "export OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_API_KEY=ollama "
    "REFLOOP_MODEL=qwen2.5:0.5b": "needs Ollama",
    "export REFLOOP_LLM_CONCURRENCY=1": "needs Ollama (the setting itself is checked by "
        "the configuration page's test)",
}


@dataclass
class Ran:
    command: DocCommand
    status: int
    out: str
    err: str
    seconds: float = 0.0

    @property
    def output(self) -> str:
        return self.out + self.err


@dataclass
class DocShell:
    """One bash for a page's commands: `cd`, `export` and functions carry over, as in a
    reader's terminal. `subs` replaces a page's placeholders (`report-1`, `sess-...`) with
    this run's values, in each command's text before it runs."""

    cwd: Path
    env: dict[str, str]
    subs: dict[str, str] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cwd.mkdir(parents=True, exist_ok=True)
        self._io = Path(tempfile.mkdtemp(prefix="doc-shell-"))  # never in the reader's cwd
        self._bash = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=self.cwd,
                                      env=self.env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, start_new_session=True)

    def run(self, command: DocCommand, timeout_s: float = 120.0) -> Ran:
        """Run one of the page's commands; fail the test unless it does what EXPECT says."""
        expect = EXPECT.get(command.key)
        assert expect is not None, f"{command.page}:{command.line}: not in EXPECT: {command.key}"
        text = command.text
        for placeholder, value in self.subs.items():
            text = text.replace(placeholder, value)
        out, err = self._io / "out", self._io / "err"
        script = f"{{ {text}\n}} >{shlex.quote(str(out))} 2>{shlex.quote(str(err))} " \
                 f"</dev/null\necho \"__status=$?\"\n"
        assert self._bash.stdin is not None and self._bash.stdout is not None
        started = time.monotonic()
        self._bash.stdin.write(script)
        self._bash.stdin.flush()
        status = self._status(timeout_s, text)
        ran = Ran(command, status, out.read_text(), err.read_text(), time.monotonic() - started)
        print(f"{ran.seconds:5.1f} s  {command.page}:{command.line} {command.key[:60]}")
        where = f"{command.page}:{command.line} `{text}`"
        assert ran.status == expect.status, \
            f"{where} exited {ran.status}:\n{ran.out[-3000:]}\n{ran.err[-3000:]}"
        assert expect.contains in ran.output, \
            f"{where} did not print {expect.contains!r}:\n{ran.out[-3000:]}\n{ran.err[-3000:]}"
        self.ran.append(command.key)
        return ran

    def _status(self, timeout_s: float, text: str) -> int:
        assert self._bash.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._bash.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                assert left > 0 and selector.select(left), f"`{text}` ran over {timeout_s} s"
                line = self._bash.stdout.readline()
                assert line, f"bash ended during `{text}`"
                if line.startswith("__status="):
                    return int(line.split("=", 1)[1])

    def run_page(self, page: str) -> list[Ran]:
        """Every command of the page no entry of EXCLUDED names, in order."""
        return [self.run(command) for command in commands(page)
                if command.key not in EXCLUDED]

    def assert_ran_page(self, page: str) -> None:
        left = [c.key for c in commands(page) if c.key not in EXCLUDED and c.key not in self.ran]
        assert not left, f"{page}: commands in EXPECT that this test did not run: {left}"

    def close(self) -> None:
        if self._bash.poll() is None:
            self._bash.stdin.close()  # type: ignore[union-attr]
            try:
                self._bash.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._bash.kill()
        shutil.rmtree(self._io, ignore_errors=True)

    def __enter__(self) -> DocShell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shell_env(**extra: str) -> dict[str, str]:
    """The environment a reader has after `make demo`: the venv's commands (`refloop`,
    `temporal`, `pip`) on PATH, no model endpoint, server or database of the test run's;
    semantic indexing off."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "TEMPORAL_ADDRESS", "DATABASE_URL",
                        "REFLOOP_API_TOKEN", "REFLOOP_MCP_CONFIG", "MAKEFLAGS", "MFLAGS")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # As in the rest of the suite: no embedding process per task (the semantic tests
    # index; here it would only cost a loaded machine a minute).
    env["REFLOOP_SEMANTIC_INDEX"] = "false"
    env.update(extra)
    return env
