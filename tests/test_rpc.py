"""llama.cpp's RPC backend: endpoints checked before anything loads, and, on a build with RPC
(scripts/setup.sh builds both), the tiny model split across two local
`ggml-rpc-server` processes and the CPU, greedy output with speculation equal to plain
decoding on the same split.

The split model runs in a child process: ggml keeps registered servers for the life of a
process, and a later model load there would ask the stopped servers for their memory."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from lookahead.adapters.llama_cpp import rpc

SERVER = Path(sys.executable).parent / "ggml-rpc-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_endpoints_are_parsed_and_a_bad_one_is_named():
    assert rpc.parse_endpoints("127.0.0.1:50052, hostb:7000") == ["127.0.0.1:50052", "hostb:7000"]
    assert rpc.parse_endpoints(["a:1"]) == ["a:1"]
    for bad in ("127.0.0.1", "host:", ":80", "host:70000", "host:http"):
        with pytest.raises(ValueError, match="RPC endpoint"):
            rpc.parse_endpoints(bad)


def test_a_server_that_is_down_is_an_error_naming_it_not_a_hang():
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(rpc.RpcError, match=f"RPC server {endpoint} is not reachable"):
        rpc.check_reachable(endpoint, timeout=2.0)
    assert time.monotonic() - t0 < 5


def test_the_cli_names_an_unreachable_rpc_server_before_loading_anything(tmp_path):
    from lookahead.cli.main import main

    endpoint = f"127.0.0.1:{free_port()}"
    (tmp_path / "a.txt").write_text("hello\n")
    out = CliRunner().invoke(main, ["rewrite", str(tmp_path / "a.txt"), "-i", "Fix", "--rpc", endpoint])
    assert out.exit_code == 2 and f"RPC server {endpoint} is not reachable" in out.output
    assert (tmp_path / "a.txt").read_text() == "hello\n"
    out = CliRunner().invoke(main, ["generate", "hi", "--rpc", "nohostport"])
    assert out.exit_code == 2 and "'nohostport' is not HOST:PORT" in out.output


CHILD = r"""
import json, sys
import lookahead
from lookahead.models import resolve
fast = lookahead.load(resolve("smollm2-135m"), n_ctx=1024, rpc=sys.argv[1].split(","), n_gpu_layers=int(sys.argv[2]),
                      verbose=True)
prompt = open(sys.argv[3]).read()
plain = fast.create_completion(prompt, max_tokens=96, temperature=0, speculate=False)
spec = fast.create_completion(prompt, max_tokens=96, temperature=0)
print(json.dumps({"plain": plain["choices"][0]["text"], "spec": spec["choices"][0]["text"],
                  "stats": spec["speculation"], "cost": fast.verify_cost_ms((1, 8))}))
"""


@pytest.fixture
def two_servers():
    if not SERVER.exists() or not rpc.available():
        pytest.skip("this build has no RPC backend or ggml-rpc-server (scripts/setup.sh without LOOKAHEAD_RPC=0)")
    ports = [free_port(), free_port()]
    procs = [subprocess.Popen([str(SERVER), "-H", "127.0.0.1", "-p", str(p), "-t", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=dict(os.environ, LOOKAHEAD_EXACT_BATCHES="1"))  # the servers exact too
             for p in ports]
    try:
        deadline = time.monotonic() + 30
        for port in ports:
            while True:
                try:
                    rpc.check_reachable(f"127.0.0.1:{port}", timeout=1.0)
                    break
                except rpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        yield [f"127.0.0.1:{p}" for p in ports], procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def copy_prompt(folder: Path, head_chars: int) -> Path:
    """A prompt whose continuation copies a file it holds (drafts are accepted)."""
    source = (SAMPLES / "code" / "textutils.py").read_text()
    prompt = folder / "prompt.txt"
    prompt.write_text(source + "\n\n# The same file again, unchanged:\n\n" + source[:head_chars])
    return prompt


@pytest.mark.model
def test_a_model_split_across_two_rpc_servers_and_the_cpu_decodes_as_plain_does(two_servers, tmp_path):
    endpoints, _ = two_servers
    prompt = copy_prompt(tmp_path, 600)
    # 30 layers: 20 on the two servers, 10 (and the output) on this process's CPU
    out = subprocess.run([sys.executable, "-c", CHILD, ",".join(endpoints), "20", str(prompt)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # the layers really are on the servers (llama.cpp's load log names each buffer's device)
    for endpoint in endpoints:
        assert re.search(rf"RPC\d+\[{re.escape(endpoint)}\]\S* model buffer size", out.stderr), out.stderr[-3000:]
    # and the output layer stayed here: its logits do not cross the network (tied embeddings)
    assert re.search(r"tensor token_embd\.weight .* buffer type overridden to CPU", out.stderr), out.stderr[-3000:]
    assert result["spec"] == result["plain"] != ""
    stats = result["stats"]
    assert stats["accepted"] > 20 and stats["tokens_per_pass"] > 1.5, (stats, result["cost"])
    assert stats["exact"] is False and "RPC servers" in stats["exact_reason"]
    assert set(result["cost"]) == {"1", "8"} or set(result["cost"]) == {1, 8}


KILL_CHILD = r"""
import json, os, signal, sys
import lookahead
from lookahead.adapters.llama_cpp import rpc
from lookahead.models import resolve
fast = lookahead.load(resolve("smollm2-135m"), n_ctx=1024, rpc=sys.argv[1].split(","), n_gpu_layers=20)
prompt = open(sys.argv[3]).read()
out = {"whole": fast.create_completion(prompt, max_tokens=160, temperature=0)["choices"][0]["text"], "streamed": ""}
try:
    for i, chunk in enumerate(fast.create_completion(prompt, max_tokens=160, temperature=0, stream=True)):
        out["streamed"] += chunk["choices"][0]["text"]
        if i == 2:
            os.kill(int(sys.argv[2]), signal.SIGKILL)
    out["during"] = "no error"
except rpc.RpcServerLost as e:
    out["during"] = str(e)
try:
    fast.create_completion(prompt, max_tokens=16, temperature=0)
    out["next"] = "no error"
except rpc.RpcServerLost as e:
    out["next"] = str(e)
try:  # logprobs: llama-cpp-python's own decoding (the plain fallback path)
    fast.create_completion(prompt, max_tokens=4, temperature=0, logprobs=1)
    out["plain_path"] = "no error"
except rpc.RpcServerLost as e:
    out["plain_path"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.model
def test_a_server_killed_mid_request_is_an_error_naming_it_and_the_process_lives_on(two_servers, tmp_path):
    endpoints, procs = two_servers
    prompt = copy_prompt(tmp_path, 300)
    out = subprocess.run([sys.executable, "-c", KILL_CHILD, ",".join(endpoints), str(procs[1].pid), str(prompt)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]  # no abort: the process ran to its end
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert f"RPC server {endpoints[1]} went away during this request" in result["during"], result
    # what was streamed before the loss is the model's own text; nothing from zeroed logits
    assert result["streamed"] and result["whole"].startswith(result["streamed"]), result
    assert len(result["streamed"]) < len(result["whole"])
    # the next request fails the same way at once: the layers that server held are gone
    assert f"RPC server {endpoints[1]} went away during an earlier request" in result["next"], result
    assert f"RPC server {endpoints[1]} went away during an earlier request" in result["plain_path"], result


@pytest.mark.model
def test_serve_answers_503_after_a_server_is_lost_and_keeps_running(two_servers, tmp_path):
    """`lookahead serve --rpc`: one server killed between requests; the next request is a 503
    naming it, /health says so, and the process still answers (and stops on Ctrl-C)."""
    import signal

    import httpx

    endpoints, procs = two_servers
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        serve = subprocess.Popen([str(Path(sys.executable).parent / "lookahead"), "serve", "--model", "smollm2-135m",
                                  "--port", str(port), "--n-ctx", "1024", "--rpc", ",".join(endpoints),
                                  "--gpu-layers", "20", "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    body = {"prompt": "One, two, three, four,", "max_tokens": 8, "temperature": 0}
    try:
        deadline = time.monotonic() + 180
        while True:
            assert serve.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.3)
        assert httpx.post(url + "/v1/completions", json=body, timeout=120).status_code == 200
        procs[0].kill()
        procs[0].wait()
        for when in ("during this request", "during an earlier request"):
            r = httpx.post(url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["code"] == "rpc_server_lost" and f"RPC server {endpoints[0]} went away {when}" in error["message"]
        h = httpx.get(url + "/health", timeout=10)
        assert h.status_code == 503 and h.json()["status"] == "unavailable" and endpoints[0] in h.json()["error"]
        assert serve.poll() is None  # alive
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            returncode = serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            returncode = serve.wait()
    assert returncode == 0, log_path.read_text()[-3000:]


@pytest.mark.model
def test_doctor_lists_the_rpc_devices_and_times_decodes_through_them(two_servers):
    from lookahead.cli.main import main

    endpoints, _ = two_servers
    out = CliRunner().invoke(main, ["doctor", "--model", "smollm2-135m", "--context", "64", "--json",
                                    "--rpc", ",".join(endpoints)])
    assert out.exit_code == 0, out.output[-3000:]
    report = json.loads(out.output)
    assert report["rpc"]["endpoints"] == endpoints
    assert sorted(d["endpoint"] for d in report["rpc"]["devices"]) == sorted(endpoints)
    assert all(d["total_mib"] > 0 for d in report["rpc"]["devices"])
    assert report["check"]["ok"] and set(report["check"]["timings_ms"]) == {"1", "8", "64"}
