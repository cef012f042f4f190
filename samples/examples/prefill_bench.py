"""Prefill of a ~3k-token prompt: llama-cpp-python vs lookahead, interleaved, cache cleared."""
import time, statistics, sys
import llama_cpp, lookahead
from lookahead.models import default_model_path
from pathlib import Path
llm = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=4096, verbose=False)
fast = lookahead.wrap(llm)
docs = "".join(p.read_text() for p in sorted(Path("samples").rglob("*")) if p.suffix in (".md", ".py"))
toks = llm.tokenize(docs.encode())[:3000]
prompt = llm.detokenize(toks).decode("utf-8", "ignore")
print("prompt tokens", len(llm.tokenize(prompt.encode())))
res = {"llama-cpp-python": [], "lookahead": []}
for rep in range(5):
    for name, f in (("llama-cpp-python", llm.create_completion), ("lookahead", fast.create_completion)) if rep % 2 == 0 else (("lookahead", fast.create_completion), ("llama-cpp-python", llm.create_completion)):
        llm.reset(); llm._ctx.kv_cache_clear()
        t0 = time.perf_counter(); f(prompt, max_tokens=1, temperature=0); res[name].append(time.perf_counter() - t0)
for k, v in res.items(): print(k, "median s", round(statistics.median(v), 3), [round(x, 2) for x in v])
print("ratio llama-cpp-python / lookahead", round(statistics.median(res["llama-cpp-python"]) / statistics.median(res["lookahead"]), 3))
