"""Speculation over llama.cpp's RPC backend under network latency, on one machine.

Starts two `ggml-rpc-server` processes on 127.0.0.1, puts a relay in front of each that holds
every chunk of traffic for half the round-trip time in each direction, and splits the model
across them (`--layers` on the servers, the rest on this process's CPU). For each round trip
it runs a child process (ggml keeps registered servers for a process's life; round trip -1:
the whole model in that process, no RPC, to compare) that decodes two
prompts plainly and with lookahead, interleaved, `--reps` times. One prompt copies a file it
was shown (copy), the other is open prose (open). Prints one JSON line per round trip and
prompt: decode tokens/s of each, the speedup, tokens per pass, and the cost curve measured
through the relays.

With `--bench FILE` (repeatable) it runs `lookahead bench FILE --json` instead, through the
same relays (plain and lookahead only; `--bench-arg` passes more options, e.g. `--limit 1`),
and prints each category's speedups.

    .venv/bin/python samples/examples/rpc_latency.py                    # tiny model, no RPC, 0/1/5/20 ms
    .venv/bin/python samples/examples/rpc_latency.py --rtt-ms 5 --model qwen2.5-coder-1.5b --layers 20
    .venv/bin/python samples/examples/rpc_latency.py --model qwen2.5-coder-1.5b --layers -1 \
        --rtt-ms -1 --rtt-ms 5 --bench samples/workloads.jsonl --bench-arg=--limit=1
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVER = Path(sys.executable).parent / "ggml-rpc-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the relay (run as a child: `rpc_latency.py relay LISTEN_PORT TARGET_PORT ONE_WAY_MS`) ----
async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy reader to writer, each chunk released `delay_s` after it arrived, in order."""
    queue: asyncio.Queue = asyncio.Queue()

    async def release() -> None:
        while True:
            due, data = await queue.get()
            if data is None:
                writer.close()
                return
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    task = asyncio.create_task(release())
    while True:
        data = await reader.read(1 << 20)
        await queue.put((time.monotonic() + delay_s, data or None))
        if not data:
            break
    await task


async def _relay(listen: int, target: int, delay_s: float) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        tr, tw = await asyncio.open_connection("127.0.0.1", target)
        for s in (w, tw):
            s.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(r, tw, delay_s), _pipe(tr, w, delay_s), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


CHILD = r"""
import json, statistics, sys, time
import lookahead
endpoints, model, layers, reps = [e for e in sys.argv[1].split(",") if e], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fast = lookahead.load(model, n_ctx=2048, rpc=endpoints or None, n_gpu_layers=layers if endpoints else 0)
src = open(sys.argv[5]).read()
prompts = {"copy": src + "\n\n# The same file again, unchanged:\n\n" + src[:200],
           "open": "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n"}
for name, prompt in prompts.items():
    runs = {False: [], True: []}
    for _ in range(reps):
        for speculate in (False, True):
            out = fast.create_completion(prompt, max_tokens=160, temperature=0, speculate=speculate)
            s = out["speculation"]
            runs[speculate].append((s["tokens_per_second"], s.get("tokens_per_pass") or 1.0,
                                    out["choices"][0]["text"]))
    plain = statistics.median(r[0] for r in runs[False])
    spec = statistics.median(r[0] for r in runs[True])
    print(json.dumps({"prompt": name, "plain_tok_s": round(plain, 1), "lookahead_tok_s": round(spec, 1),
                      "speedup": round(spec / plain, 2),
                      "tokens_per_pass": round(statistics.median(r[1] for r in runs[True]), 2),
                      "same_text": runs[False][0][2] == runs[True][0][2]}), flush=True)
print(json.dumps({"cost_ms": fast.verify_cost_ms((1, 8, 64))}), flush=True)
"""


def run_bench(path: str, endpoints: str, args: argparse.Namespace, env: dict) -> list[dict]:
    """`lookahead bench PATH --json` through `endpoints` (none: no RPC); one dict per category."""
    cmd = [sys.executable, "-m", "lookahead.cli.main", "bench", path, "--json", "--model", args.model,
           "--reps", str(args.reps), "--methods", "plain", "--methods", "lookahead", *args.bench_arg]
    cmd += ["--rpc", endpoints, "--gpu-layers", str(args.layers)] if endpoints else []
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    data = json.loads(out.stdout)
    if args.save:  # everything the bench printed (texts, per-run timings), for reading later
        args.save.mkdir(parents=True, exist_ok=True)
        rtt = endpoints and args.current_rtt
        (args.save / f"{Path(path).stem}-rtt{rtt if endpoints else 'none'}.json").write_text(out.stdout)
    if data.get("config", {}).get("mode") == "rewrite":
        rows = [dict(s, temperature=r["temperature"]) for r in data["results"] for s in r["summary"]]
        return [{"bench": "rewrite", "category": r["category"], "temperature": r["temperature"], "n": r["n"],
                 "speedup": round(r["speedup"], 2), "decode_speedup": round(r["decode_speedup"], 2),
                 "identical": f"{r['identical_to_plain']}/{r['n']}"} for r in rows]
    return [{"bench": "workloads", "category": r["category"], "temperature": r["temperature"], "n": r["n"],
             "speedup": r["speedup"].get("lookahead"), "decode_speedup": r["decode_speedup"].get("lookahead"),
             "tokens_per_pass": ((r.get("speculation") or {}).get("lookahead") or {}).get("tokens_per_pass"),
             "identical": "{identical}/{of}".format(**r["identical"]["lookahead"]) if r.get("identical") else None}
            for r in data["summary"]]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "relay":
        listen, target, one_way_ms = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
        asyncio.run(_relay(listen, target, one_way_ms / 1000))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rtt-ms", type=float, action="append",
                    help="round trips to try; -1: no RPC, the whole model here (default -1, 0, 1, 5, 20)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=20, help="layers on the servers (-1: all)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--server-threads", type=int, default=1,
                    help="threads of each ggml-rpc-server (they compute in turn, one layer range each)")
    ap.add_argument("--bench", action="append", default=[], metavar="FILE",
                    help="run `lookahead bench FILE` (workloads or rewrite items) instead of the two prompts")
    ap.add_argument("--bench-arg", action="append", default=[], metavar="OPTION",
                    help="more options for `lookahead bench` (repeatable), e.g. --bench-arg=--limit=1")
    ap.add_argument("--save", type=Path, default=None, metavar="DIR",
                    help="with --bench: keep each run's whole JSON in DIR")
    args = ap.parse_args()
    if not SERVER.exists():
        sys.exit(f"no {SERVER}: build it with scripts/setup.sh")
    env = dict(os.environ, LOOKAHEAD_EXACT_BATCHES=os.environ.get("LOOKAHEAD_EXACT_BATCHES", "1"))
    procs = []
    try:
        ports = [free_port(), free_port()]
        procs += [subprocess.Popen([str(SERVER), "-H", "127.0.0.1", "-p", str(p), "-t", str(args.server_threads)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
        time.sleep(1.0)
        for rtt in args.rtt_ms or [-1.0, 0.0, 1.0, 5.0, 20.0]:
            args.current_rtt = rtt
            relays = [(free_port(), p) for p in ports] if rtt >= 0 else []
            rprocs = [subprocess.Popen([sys.executable, __file__, "relay", str(lp), str(tp), str(rtt / 2)])
                      for lp, tp in relays]
            time.sleep(1.0)
            try:
                endpoints = ",".join(f"127.0.0.1:{lp}" for lp, _ in relays)
                if args.bench:
                    for path in args.bench:
                        for row in run_bench(path, endpoints, args, env):
                            print(json.dumps({"rtt_ms": rtt, **row}), flush=True)
                    continue
                out = subprocess.run([sys.executable, "-c", CHILD, endpoints, args.model, str(args.layers),
                                      str(args.reps), str(HERE.parent / "code" / "textutils.py")],
                                     capture_output=True, text=True, env=env, timeout=3600)
                if out.returncode != 0:
                    sys.exit(f"rtt {rtt} ms: the child failed:\n{out.stderr[-2000:]}")
                for line in out.stdout.strip().splitlines():
                    print(json.dumps({"rtt_ms": rtt, **json.loads(line)}), flush=True)
            finally:
                for p in rprocs:
                    p.kill()
                    p.wait()
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
