"""Serving fleet: the ERNIE client and serving processes, with the model time fixed by the benchmark's engine.

Every serving process runs the real generator wrapped in `tests.support.serving_engines:fixed_latency` (plugged
in with `--engine`: each request keeps its inference thread at least that long; the product has no such
option), so the figures measure the client and the server, not this CPU. The client is the one Spark executors use
(`dgx_assets.generation.client.ErnieClient`, pooled keep-alive
connections, round-robin over endpoints); servers are started with `generation.launcher`. Images are
64x64 so that encoding them costs next to nothing.

Before timing, the images that come back through client and server must be byte-identical to the PNGs
the bare predictor (`serving.engine.GeneratorEngine.generate`, in its own process: paddle never enters
this one) makes for the same prompt, seed and size.

Goals:
- throughput with 2 instances over 1 instance, the client keeping 4 requests in flight: >= 1.9 (2.0 is
  the limit);
- new TCP connections per request over a run (counted by the client's connection pools): <= 1 %;
- sockets left in TIME_WAIT on the servers' ports after 1,000 requests (new ones only): <= 5;
- per-request overhead of a sequential call through client and server against the bare predictor call
  with the same fixed latency: <= 10 %.

Hostile clients, against a third server with the product's default limits (same engine):
- 1,000 idle connections held: the server's resident memory grows <= 100 MB, and another client's p99
  latency stays <= 2x its value without them;
- 50 slow-loris connections (one header byte a second): each closed within the header timeout (10 s,
  goal <= 10.5 s from connecting), while another client is served throughout;
- a request announcing a 99 MB body: refused (413) from its header in <= 50 ms, before any body is sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import REPO, Report, Timing, bootstrap_interval, check, isolate_state, main, work_dir
from tests.support.serving_engines import fixed_latency_args

NAME = "serving"
PROMPT = "Electroluminescence image of a defective mono solar cell with a diagonal crack"
SIZE = 64
CONCURRENCY = 4

BARE_PREDICTOR = r"""
import base64, hashlib, json, sys, time
from tests.support.serving_engines import FixedLatency
from dgx_assets.serving.engine import GeneratorEngine
args = json.loads(sys.argv[1])
plain = GeneratorEngine(args["model_dir"], device="cpu")
engine = FixedLatency(plain, args["fixed_latency_ms"] / 1000.0)  # what each server runs per request
tokens = engine.tokenize(args["prompt"])
size = args["size"]
digests = [hashlib.sha256(plain.generate(tokens, seed, size, size)[0]).hexdigest() for seed in args["seeds"]]
engine.generate(tokens, 0, size, size)
times = []
for index in range(args["calls"]):
    started = time.monotonic()
    engine.generate(tokens, index, size, size)
    times.append(time.monotonic() - started)
print(json.dumps({"digests": digests, "latencies_s": times}))
"""


def bare_predictor(model_dir: Path, fixed_latency_ms: float, calls: int, seeds: list[int]) -> dict:
    args = {
        "model_dir": str(model_dir),
        "prompt": PROMPT,
        "size": SIZE,
        "fixed_latency_ms": fixed_latency_ms,
        "calls": calls,
        "seeds": seeds,
    }
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", BARE_PREDICTOR, json.dumps(args)],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"bare predictor failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- sockets ----------------------------------------------------------------------------------------------


def time_wait_sockets(ports: set[int]) -> set[tuple[str, str]]:
    """TIME_WAIT sockets (local, remote address) with a server port on either end, from /proc/net/tcp*."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state != "06":  # TIME_WAIT
                continue
            if int(local.rsplit(":", 1)[1], 16) in ports or int(remote.rsplit(":", 1)[1], 16) in ports:
                found.add((local, remote))
    return found


def connections_opened(client) -> int:
    """New TCP connections the client's urllib3 pools have opened so far."""
    pools = client._pool.pools  # urllib3's per-host pools; each counts the connections it opened
    return sum(pools[key].num_connections for key in pools.keys())


# --- client runs ------------------------------------------------------------------------------------------


def make_client(urls: list[str], concurrency: int = CONCURRENCY):
    from dgx_assets.generation.client import ErnieClient
    from dgx_assets.generation.client_settings import ClientSettings

    return ErnieClient(ClientSettings(endpoints=tuple(urls), concurrency=concurrency))


def burst(client, requests: int, seed_offset: int = 0) -> float:
    """`requests` images through generate_many; seconds, after checking every one came back."""
    jobs = [(PROMPT, SIZE, SIZE, seed_offset + i) for i in range(requests)]
    started = time.perf_counter()
    replies = client.generate_many(jobs)
    seconds = time.perf_counter() - started
    failed = [r.error for r in replies if not r.ok]
    check(not failed, f"{len(failed)} of {requests} requests failed, e.g. {failed[:1]}")
    return seconds


def sequential_latencies(client, calls: int) -> list[float]:
    client.generate(PROMPT, SIZE, SIZE, 0)  # warm: connection open, /status read
    times = []
    for index in range(calls):
        started = time.perf_counter()
        reply = client.generate(PROMPT, SIZE, SIZE, index)
        times.append(time.perf_counter() - started)
        check(reply.ok, f"request failed: {reply.error}")
    return times


def run(report: Report, args) -> None:
    isolate_state(NAME)
    from dgx_assets.generation import launcher
    from tests.support.quick_generator import cached_quick_generator

    fixed_ms = args.fixed_latency_ms or (50.0 if args.quick else 100.0)
    burst_requests = 40 if args.quick else 300
    time_wait_requests = 200 if args.quick else 1_000
    sequential_calls = 20 if args.quick else 60
    report.params.update(
        fixed_latency_ms=fixed_ms,
        image_size=SIZE,
        client_concurrency=CONCURRENCY,
        burst_requests=burst_requests,
        time_wait_requests=time_wait_requests,
        sequential_calls=sequential_calls,
    )
    model_dir = cached_quick_generator()  # shared with the tests, rebuilt when its code changes
    seeds = [0, 1, 2, 3]
    bare = bare_predictor(model_dir, fixed_ms, sequential_calls, seeds)

    logs = work_dir(NAME) / "logs"
    servers = launcher.start_local_servers(3, model_dir, log_dir=logs, extra_args=fixed_latency_args(fixed_ms))
    servers, hostile_target = servers[:2], servers[2]
    try:
        urls = [server.url for server in servers]
        check_same_png(urls, seeds, bare["digests"])
        fleet = {"1 instance": make_client(urls[:1]), "2 instances": make_client(urls)}
        opened, left = fleet_run(report, fleet["2 instances"], {server.port for server in servers}, time_wait_requests)
        one, two = throughput_rounds(report, fleet, burst_requests, args.repeats, fixed_ms)
        overhead, overhead_interval, served = request_overhead(
            report, make_client(urls[:1], concurrency=1), bare, sequential_calls
        )
        hostile = hostile_probes(report, hostile_target, args.quick)
    finally:
        launcher.stop_servers([*servers, hostile_target])

    report.ratio("serving_two_over_one_instance", one, two, ">=", 1.9)
    report.result("serving_new_connections_pct", 100.0 * opened / time_wait_requests, "<=", 1.0)
    report.result("serving_time_wait_after_requests", left, "<=", 5)
    report.result("serving_request_overhead", overhead, "<=", 0.10, interval=overhead_interval, rounds=served)
    report.result("serving_idle_connections_rss_growth_mb", hostile["rss_growth_mb"], "<=", 100)
    report.result("serving_idle_connections_p99_ratio", hostile["p99_ratio"], "<=", 2.0)
    report.result("serving_slow_loris_closed_max_s", hostile["loris_closed_max_s"], "<=", hostile["header_timeout_s"] + 0.5)
    report.result("serving_over_limit_body_refused_max_ms", hostile["refused_max_ms"], "<=", 50)


def check_same_png(urls: list[str], seeds: list[int], digests: list[str]) -> None:
    """Same result: the images through client and server are the bare predictor's PNG bytes."""
    checker = make_client(urls, concurrency=1)
    for seed, digest in zip(seeds, digests):
        reply = checker.generate(PROMPT, SIZE, SIZE, seed)
        check(reply.ok, f"request failed: {reply.error}")
        check(
            hashlib.sha256(base64.b64decode(reply.payload_b64)).hexdigest() == digest,
            f"seed {seed}: the served PNG differs from the bare predictor's",
        )
    print(f"  same PNG bytes as the bare predictor for seeds {seeds}")


def fleet_run(report: Report, client, ports: set[int], requests: int) -> tuple[int, int]:
    """TIME_WAIT and new connections over `requests` on the two-instance fleet, with the client warm (as a
    Spark worker's pooled client is after its first batch): (connections opened, new TIME_WAIT sockets)."""
    burst(client, 2 * CONCURRENCY)
    before, opened_before = time_wait_sockets(ports), connections_opened(client)
    seconds = burst(client, requests, seed_offset=10_000)
    opened, stats = connections_opened(client) - opened_before, client.stats()
    left = time_wait_sockets(ports) - before
    report.figure(
        "fleet_run",
        {
            "requests": requests,
            "seconds": round(seconds, 2),
            "per_s": round(requests / seconds, 2),
            "connections_opened": opened,
            "connections_at_warm_up": opened_before,
            "per_endpoint": stats,
            "new_time_wait_sockets": len(left),
        },
    )
    print(
        f"{requests} requests on 2 instances in {seconds:.1f}s: {opened} new connections "
        f"({opened_before} opened while warming up), {len(left)} new TIME_WAIT sockets; per endpoint {stats}"
    )
    shares = [entry["requests"] for entry in stats.values()]
    check(min(shares) > 0.4 * requests, f"round-robin is lopsided: {shares}")
    return opened, len(left)


def throughput_rounds(report: Report, fleet: dict, requests: int, repeats: int, fixed_ms: float) -> tuple[Timing, Timing]:
    """Throughput, 1 instance vs 2 (same client settings, 4 requests in flight), interleaved."""
    for warm_client in fleet.values():
        burst(warm_client, 2 * CONCURRENCY)
    samples: dict[str, list[float]] = {"1 instance": [], "2 instances": []}
    for round_index in range(repeats):
        order = list(samples) if round_index % 2 == 0 else list(samples)[::-1]
        for name in order:
            seconds = burst(fleet[name], requests, seed_offset=20_000 + round_index * requests)
            samples[name].append(seconds)
            print(f"  [{round_index + 1}/{repeats}] {name}: {requests / seconds:.1f} requests/s")
    one, two = Timing(samples["1 instance"]), Timing(samples["2 instances"])
    report.figure("one_instance", one.to_dict(requests))
    report.figure("two_instances", two.to_dict(requests))
    report.figure("ceiling_per_instance_per_s", round(1000 / fixed_ms, 2))
    print(f"1 instance: {one.describe(requests, 'requests')} (ceiling {1000 / fixed_ms:.1f}/s)")
    print(f"2 instances: {two.describe(requests, 'requests')} (ceiling {2000 / fixed_ms:.1f}/s)")
    if one.rate(requests) > 1.05 * 1000 / fixed_ms:
        report.note(
            f"one instance served {one.rate(requests):.1f} requests/s, over the "
            f"{1000 / fixed_ms:.1f}/s its fixed latency allows: the server's hold does not cost each "
            "request the full model time, so the figure measures the client's requests in flight"
        )
    return one, two


def request_overhead(report: Report, client, bare: dict, calls: int) -> tuple[float, tuple[float, float], int]:
    """Sequential calls through client and server vs the bare predictor call: (overhead, its interval, calls)."""
    served = sequential_latencies(client, calls)
    bare_median, served_median = statistics.median(bare["latencies_s"]), statistics.median(served)
    overhead = served_median / bare_median - 1
    interval = bootstrap_interval(lambda s, b: statistics.median(s) / statistics.median(b) - 1, served, bare["latencies_s"])
    report.figure("bare_predictor_latency", Timing(bare["latencies_s"]).to_dict())
    report.figure("served_latency", Timing(served).to_dict())
    report.figure("overhead_ms", round((served_median - bare_median) * 1000, 2))
    print(
        f"sequential request {served_median * 1000:.1f} ms vs bare predictor {bare_median * 1000:.1f} ms: "
        f"+{(served_median - bare_median) * 1000:.1f} ms ({overhead:.1%})"
    )
    return overhead, interval, len(served)


# --- hostile clients --------------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def hostile_probes(report: Report, server, quick: bool) -> dict:
    """Idle connections, slow loris and an over-limit body against one server with the default limits."""
    from dgx_assets.serving.config import ServingConfig

    defaults = ServingConfig()
    idle_count = 200 if quick else 1_000
    loris_count = 10 if quick else 50
    calls = 20 if quick else 60  # 60 x 100 ms: measured well inside the 10 s header timeout that ends idle connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < idle_count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, idle_count + 256), hard))
    growth, ratio = idle_connections_probe(report, server, idle_count, calls)
    loris_max = slow_loris_probe(report, server, loris_count, calls, defaults.header_timeout_s)
    return {
        "rss_growth_mb": round(growth, 1),
        "p99_ratio": ratio,
        "loris_closed_max_s": round(loris_max, 2),
        "header_timeout_s": defaults.header_timeout_s,
        "refused_max_ms": over_limit_body_probe(report, server),
    }


def idle_connections_probe(report: Report, server, idle_count: int, calls: int) -> tuple[float, float]:
    """Another client's latency and the server's memory, without and with idle connections held:
    (RSS growth in MB, p99 ratio)."""
    client = make_client([server.url], concurrency=1)
    idle_latencies = sequential_latencies(client, calls)
    rss_before = rss_mb(server.pid)
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(idle_count)]
    try:
        held_latencies = sequential_latencies(client, calls)
        rss_held = rss_mb(server.pid)
        open_now = sum(1 for sock in held if not select.select([sock], [], [], 0)[0])  # not closed by the server
    finally:
        for sock in held:
            sock.close()
    growth, ratio = rss_held - rss_before, p99(held_latencies) / p99(idle_latencies)
    report.figure(
        "idle_connections",
        {
            "held": idle_count,
            "still_open_at_end": open_now,
            "rss_before_mb": round(rss_before, 1),
            "rss_held_mb": round(rss_held, 1),
            "p99_idle_ms": round(p99(idle_latencies) * 1000, 1),
            "p99_held_ms": round(p99(held_latencies) * 1000, 1),
        },
    )
    check(open_now == idle_count, f"only {open_now} of {idle_count} idle connections lasted the measurement")
    print(
        f"{idle_count} idle connections: RSS {rss_before:.0f} -> {rss_held:.0f} MB, other client's p99 "
        f"{p99(idle_latencies) * 1000:.1f} -> {p99(held_latencies) * 1000:.1f} ms"
    )
    return growth, ratio


def slow_loris_probe(report: Report, server, loris_count: int, calls: int, header_timeout_s: float) -> float:
    """A header byte a second on each connection while another client is served: the latest close, seconds."""
    lorises = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(loris_count)]
    opened = time.monotonic()
    closed_after: dict[int, float] = {}
    with ThreadPoolExecutor(1) as pool:
        served = pool.submit(sequential_latencies, make_client([server.url], concurrency=1), calls)
        header = b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100
        for step in range(int(header_timeout_s) + 5):
            for index, sock in enumerate(lorises):
                if index in closed_after:
                    continue
                try:
                    sock.send(header[step : step + 1])
                except OSError:
                    closed_after[index] = time.monotonic() - opened
            deadline = opened + step + 1
            while (left := deadline - time.monotonic()) > 0 and len(closed_after) < loris_count:
                readable, _, _ = select.select([s for i, s in enumerate(lorises) if i not in closed_after], [], [], left)
                for sock in readable:
                    index = lorises.index(sock)
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if not data or data.startswith(b"HTTP/1.1 408"):
                        closed_after.setdefault(index, time.monotonic() - opened)
            if len(closed_after) == loris_count:
                break
        loris_served = served.result()
    for sock in lorises:
        sock.close()
    check(
        len(closed_after) == loris_count,
        f"{loris_count - len(closed_after)} slow-loris connections still open after {step + 1} s",
    )
    loris_max = max(closed_after.values())
    report.figure(
        "slow_loris",
        {
            "connections": loris_count,
            "header_timeout_s": header_timeout_s,
            "closed_after_max_s": round(loris_max, 2),
            "closed_after_min_s": round(min(closed_after.values()), 2),
            "other_client_p99_ms": round(p99(loris_served) * 1000, 1),
        },
    )
    print(
        f"{loris_count} slow-loris connections closed after {min(closed_after.values()):.2f}-{loris_max:.2f} s "
        f"(header timeout {header_timeout_s:g} s); another client's p99 meanwhile "
        f"{p99(loris_served) * 1000:.1f} ms"
    )
    return loris_max


def over_limit_body_probe(report: Report, server) -> float:
    """The 413 must come from the header alone, before any of the body is sent: the slowest refusal, ms."""
    refusals = []
    rss_before = rss_mb(server.pid)
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            started = time.perf_counter()
            sock.sendall(
                b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 99000000\r\n\r\n"
            )
            reply = sock.recv(4096)
            refusals.append(time.perf_counter() - started)
            check(reply.startswith(b"HTTP/1.1 413"), f"over-limit body answered {reply[:40]!r}")
    refused_max = max(refusals) * 1000
    report.figure(
        "over_limit_body",
        {
            "requests": len(refusals),
            "refused_max_ms": round(refused_max, 2),
            "refused_median_ms": round(statistics.median(refusals) * 1000, 2),
            "rss_growth_mb": round(rss_mb(server.pid) - rss_before, 1),
        },
    )
    print(f"99 MB bodies refused from the header in {statistics.median(refusals) * 1000:.2f} ms median, {refused_max:.2f} ms max")
    return refused_max


def add_arguments(cli) -> None:
    cli.add_argument(
        "--fixed-latency-ms", type=float, default=None, help="model time of the benchmark's engine (default 100; quick 50)"
    )


if __name__ == "__main__":
    sys.exit(main(NAME, run, __doc__, add_arguments))
