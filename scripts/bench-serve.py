#!/usr/bin/env python3
"""Throughput of `mlex serve` under concurrent clients (requests/s, tokens/s, latency).

Starts `mlex serve` on a model directory, waits for /health, then for each client count runs that
many client threads, each sending chat completions back to back (whole replies, OpenAI wire
format) for --seconds, and prints one JSON line per level plus a Markdown table. Only the
standard library: it runs on a bare GPU machine too.

  scripts/bench-serve.py --mlex target/release/mlex --model DIR [--clients 1,8,32] \
      [--max-tokens 128] [--seconds 20] [--warmup 30] [--serve-args "--max-batch 32"]

Each client's prompts differ (the client and request number are in the text), so the prompt
cache does not serve one request from another's reply.
"""
import argparse, json, os, signal, socket, statistics, subprocess, sys, threading, time
import http.client


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)


def level(port, model, clients, seconds, max_tokens):
    lat, toks, prompt_toks, errors, done = [], [], [], [], threading.Event()
    lock = threading.Lock()

    def client(i):
        n = 0
        while not done.is_set():
            body = {"model": model, "max_tokens": max_tokens, "temperature": 0,
                    "messages": [{"role": "user", "content":
                                  f"Client {i}, request {n}: tell me a long story about a dragon who learns to cook."}]}
            t = time.perf_counter()
            try:
                r = post(port, body)
            except Exception as e:  # counted, reported
                with lock:
                    errors.append(str(e))
                return
            with lock:
                if not done.is_set():
                    lat.append(time.perf_counter() - t)
                    toks.append(r["usage"]["completion_tokens"])
                    prompt_toks.append(r["usage"]["prompt_tokens"])
            n += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    time.sleep(seconds)
    done.set()
    wall = time.perf_counter() - t0
    for th in threads:
        th.join(timeout=600)
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else float("nan")
    return {"clients": clients, "requests": len(lat), "seconds": round(wall, 2),
            "requests_per_s": round(len(lat) / wall, 2), "completion_tok_s": round(sum(toks) / wall, 1),
            "mean_completion_tokens": round(statistics.mean(toks), 1) if toks else 0,
            "mean_prompt_tokens": round(statistics.mean(prompt_toks), 1) if prompt_toks else 0,
            "latency_p50_ms": round(pick(0.5), 1), "latency_p95_ms": round(pick(0.95), 1),
            "errors": len(errors), "first_error": errors[0] if errors else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlex", default="target/release/mlex")
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--serve-args", default="")
    ap.add_argument("--warmup", type=float, default=0,
                    help="seconds of untimed load at the largest client count first (on a fresh GPU machine "
                         "MLX compiles kernels for each new batch size on first use)")
    a = ap.parse_args()
    port = free_port()
    cmd = [a.mlex, "serve", "--model", f"m={a.model}", "--port", str(port)] + a.serve_args.split()
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if srv.poll() is not None:
                sys.exit(f"mlex serve exited ({srv.returncode})")
            time.sleep(0.2)
        post(port, {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "warm up"}]})
        levels = [int(x) for x in a.clients.split(",")]
        if a.warmup > 0:
            level(port, "m", max(levels), a.warmup, a.max_tokens)
        rows = []
        for n in [int(x) for x in a.clients.split(",")]:
            r = level(port, "m", n, a.seconds, a.max_tokens)
            print(json.dumps(r), flush=True)
            rows.append(r)
        one = rows[0]["completion_tok_s"] or float("nan")
        print(f"\nmodel: {a.model}  max_tokens: {a.max_tokens}  {a.seconds:g} s per level  serve args: {a.serve_args or '-'}")
        print("| clients | requests/s | completion tok/s | vs 1 client | latency p50 ms | p95 ms | errors |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['clients']} | {r['requests_per_s']} | {r['completion_tok_s']} | {r['completion_tok_s'] / one:.2f}× "
                  f"| {r['latency_p50_ms']:,} | {r['latency_p95_ms']:,} | {r['errors']} |")
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()


if __name__ == "__main__":
    main()
