"""``python -m turbospark.llama_cpp``: an unchanged script, and ``-m llama_cpp.server`` serving one request."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import numpy as np
import pytest

from conftest import require_module

import llama_models

llama_cpp = require_module("llama_cpp")

from turbospark.capture.reader import load  # noqa: E402
from turbospark.llama_cpp import capture  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import llama_cpp

    assert __name__ == "__main__"
    model, out = sys.argv[1], sys.argv[2]
    llm = llama_cpp.Llama(model_path=model, n_ctx=64, logits_all=True, type_k=0, type_v=0, flash_attn=False,
                          n_threads=1, n_threads_batch=1, verbose=False)
    llm.eval([5, 6, 7, 8, 9])
    with open(out, "w") as handle:
        json.dump({"argv": sys.argv, "path0": sys.path[0]}, handle)
    sys.exit(3)
    """
)


def environment(capture_path: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURBOSPARK_ROUTER")}
    env.update(TURBOSPARK_ROUTER_HIST=str(capture_path), TURBOSPARK_ROUTER_TRACE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env


def test_unchanged_script(tmp_path: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    built = llama_models.gguf_model("qwen3_moe", tmp_path_factory)
    script = tmp_path / "prog" / "run_model.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    seen, cap_path = tmp_path / "seen.json", tmp_path / "cap.json"
    done = subprocess.run([sys.executable, "-m", "turbospark.llama_cpp", str(script), str(built.gguf), str(seen)],
                          env=environment(cap_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert json.loads(seen.read_text()) == {"argv": [str(script), str(built.gguf), str(seen)],
                                            "path0": str(script.parent)}
    cap = load(cap_path)
    assert cap.totals.tolist() == [5 * built.top_k] * built.layers
    # The same evaluation recorded in this process gives the same ids.
    with capture(tmp_path / "here.json", trace=True):
        llama_cpp.Llama(model_path=str(built.gguf), n_ctx=64, logits_all=True, type_k=0, type_v=0, flash_attn=False,
                        n_threads=1, n_threads_batch=1, verbose=False).eval([5, 6, 7, 8, 9])
    here = load(tmp_path / "here.json")
    for layer in range(built.layers):
        np.testing.assert_array_equal(np.asarray(cap.trace[layer]), np.asarray(here.trace[layer]))


def test_usage_errors(tmp_path: pathlib.Path) -> None:
    env = environment(tmp_path / "cap.json")
    del env["TURBOSPARK_ROUTER_HIST"]
    script = tmp_path / "x.py"
    script.write_text("print('ran')\n")
    done = subprocess.run([sys.executable, "-m", "turbospark.llama_cpp", str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "set TURBOSPARK_ROUTER_HIST=PATH" in done.stderr and "ran" not in done.stdout
    done = subprocess.run([sys.executable, "-m", "turbospark.llama_cpp", str(tmp_path / "missing.py")],
                          env=environment(tmp_path / "cap.json"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no such script" in done.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_llama_cpp_server(tmp_path: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    for name in ("uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings"):
        require_module(name)
    built = llama_models.gguf_model("qwen3_moe", tmp_path_factory)
    port, cap_path = free_port(), tmp_path / "served.json"
    command = [sys.executable, "-m", "turbospark.llama_cpp", "-m", "llama_cpp.server", "--model", str(built.gguf),
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "64", "--n_threads", "1",
               "--n_threads_batch", "1", "--type_k", "0", "--type_v", "0", "--flash_attn", "false"]
    server = subprocess.Popen(command, env=environment(cap_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"{base}/v1/models", timeout=5).read()
                break
            except OSError:
                assert server.poll() is None, server.communicate()[0]
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.5)
        body = json.dumps({"prompt": "the expert router picks", "max_tokens": 3, "temperature": 0}).encode()
        request = urllib.request.Request(f"{base}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        reply = json.loads(urllib.request.urlopen(request, timeout=120).read())
    finally:
        server.send_signal(signal.SIGINT)  # uvicorn shuts down, the program returns, the capture is written
        output = server.communicate(timeout=120)[0]
    assert server.returncode == 0, output
    usage = reply["usage"]
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    cap = load(cap_path)
    # Every prompt token, then each sampled token but the last (generation stops before feeding it back).
    assert cap.phase[0].tolist() == [0] * prompt + [1] * (completion - 1)
    assert cap.seq[0].tolist() == [0] * (prompt + completion - 1)
    # llama_cpp.server's logits_all defaults to true: the last layer routes every token too.
    assert cap.phase[-1].tolist() == cap.phase[0].tolist()
