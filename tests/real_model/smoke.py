"""Whether the installed llama.cpp library can generate on this CPU: one token from the
smallest model, in a child process, so a crash is reported instead of taken for an outage.

pip's cache keeps a wheel built on another machine under the same name; llama.cpp built
for that machine's CPU (`-march=native`, the default) dies of SIGILL at its first token on
one without those instructions. `make test-real-model` runs this after installing and,
when it fails, builds the library again for this CPU (the Makefile).

Exit 0 when a token came, 1 otherwise (with the reason)."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.real_model.conftest import gguf_path

GENERATE = """
import sys
from llama_cpp import Llama
model = Llama(model_path=sys.argv[1], n_ctx=128, verbose=False)
print(repr(model("Hello", max_tokens=1)["choices"][0]["text"]))
"""


def main() -> int:
    done = subprocess.run([sys.executable, "-c", GENERATE, str(gguf_path("smollm2-135m"))],
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode == 0:
        print(f"llama.cpp generates on this CPU: {done.stdout.strip()}")
        return 0
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        why = f"killed by {name}" + (": built for another CPU" if name == "SIGILL" else "")
    else:
        why = f"exit code {done.returncode}"
    print(f"llama.cpp cannot generate here ({why}):\n{done.stderr[-2000:]}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
