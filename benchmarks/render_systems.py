"""Markdown of the engineering results (search, serving, encoding, training
speed), for `benchmarks.make_results`.
"""

from __future__ import annotations

from benchmarks.markdown import cpu_of, fmt, table


def render_search_speed(data: dict) -> list[str]:
    results = data["results"]
    batches = sorted({r["batch"] for r in results})
    grouped: dict = {}
    for r in results:
        key = (
            r.get("data", "random"),
            r.get("num_items"),
            r["bits"],
            r["num_blocks"],
            r["block_size"],
            r["method"],
        )
        grouped.setdefault(key, {})[r["batch"]] = r
    body = []
    for (source, items, bits, m, k, method), by_batch in grouped.items():
        first = next(iter(by_batch.values()))
        mark = " (extrapolated)" if first.get("extrapolated") else ""
        if first.get("kernel"):
            mark += f" [{first['kernel']}]"
        body.append(
            [source, items, bits, m, k, method + mark]
            + [by_batch[b]["qps"] if b in by_batch else None for b in batches]
            + [first.get("recall_at_100"), first.get("bytes_per_item")]
        )
    settings = data.get("settings", {})
    machine = data.get("machine", {})
    flags = ", ".join(machine.get("simd_flags") or []) or "unrecorded"
    lines = [
        f"Queries per second, k = {fmt(settings.get('k'))}, on "
        f"{machine.get('cpu', 'an unrecorded CPU')} (SIMD flags: {flags}) with "
        f"{fmt(machine.get('search_threads', machine.get('faiss_threads')))} "
        f"threads, OMP_WAIT_POLICY {machine.get('omp_wait_policy') or 'unset'} "
        f"(faiss SIMD level {machine.get('faiss_simd_level', 'unrecorded')}). "
        "`native-*`: `SubicIndex` with that native kernel forced; `faiss`, "
        "`faiss-fastscan`: with faiss's scans. `random`: uniform random codes "
        "and ReLU-Gaussian queries; a model's run directory: all 60,000 "
        "CIFAR-10 images encoded by that model, queried with 1,000 test "
        "images. recall@100 is against a float64 brute force with equal "
        "scores ordered by position; scans that cut ties otherwise (faiss's "
        "float32 sums, NumPy's `argpartition`) lose recall on the trained "
        "codes, which tie often.",
        "",
    ]
    lines += table(
        ["data", "items", "bits", "M", "K", "method"]
        + [f"queries/s @ batch {b}" for b in batches]
        + ["recall@100", "bytes/item"],
        body,
    )
    if data.get("targets"):
        lines += table(
            ["target", "ratio (wall)", "ratio (per CPU-second)", "met"],
            [
                [t["target"], t["ratio"], t.get("ratio_per_cpu_second"), t["met"]]
                for t in data["targets"]
            ],
        )
    return lines


def render_omp_policy(data: dict) -> list[str]:
    lines = [
        "`benchmarks/search_speed.py` run twice, with `OMP_WAIT_POLICY` unset "
        "and `PASSIVE`: each native kernel's ratio to faiss's Hamming scan in "
        "both runs, and how far apart they are (the goal: within 20% at "
        f"batches of 1,000; largest gap {data['largest_apart_at_1000']:.0%}). "
        "The native scan uses no OpenMP; faiss's scans do.",
        "",
    ]
    return lines + table(
        ["data", "K", "kernel", "batch", "unset", "PASSIVE", "apart"],
        [
            [
                r["data"],
                r["block_size"],
                r["method"],
                r["batch"],
                r["ratio_unset"],
                r["ratio_passive"],
                f"{r['apart']:.0%}",
            ]
            for r in data["rows"]
        ],
    )


def render_shared_loads(data: dict) -> list[str]:
    rows = data["rows"]
    items = rows[0]["num_items"] if rows else 0
    lines = [
        "The x86 kernels of 4-bit sub-codes (`K = 16`) scan four queries of a "
        "batch in one pass over the codes; here capped at one and two "
        "(`native.search(..., queries_per_load=)`), batches of 1,000 on one "
        "thread (best of interleaved runs), then single queries on one thread "
        "and on every core, whose rows are split in ranges of at least 12 MB "
        f"(median latency). {items:,} random codes, on {cpu_of(data)}.",
        "",
    ]
    batches = [
        [
            r["bits"],
            r["kernel"],
            r["queries_per_load"],
            f"{r['qps']:,.0f}",
            f"{r['qps_per_cpu_second']:,.0f}",
            f"{r['over_one_a_load']:.2f}x",
        ]
        for r in rows
        if r["batch"] > 1
    ]
    singles = [
        [
            r["bits"],
            f"{r['code_megabytes']:.1f}",
            r["kernel"],
            r["threads"],
            f"{r['qps']:,.0f}",
            f"{r['qps_per_cpu_second']:,.0f}",
            f"{r['over_one_thread']:.2f}x",
        ]
        for r in rows
        if r["batch"] == 1
    ]
    return (
        lines
        + table(
            ["bits", "kernel", "queries a load", "q/s", "q/CPU-s", "over one a load"],
            batches,
        )
        + table(
            ["bits", "codes (MB)", "kernel", "threads", "q/s", "q/CPU-s", "over one"],
            singles,
        )
    )


def render_milvus_speed(data: dict) -> list[str]:
    settings = data.get("settings", {})
    pictures = bool(settings.get("pictures"))
    local, local_key = (
        ("ImageIndex", "image_index") if pictures else ("SubicIndex", "subic_index")
    )
    codes = (
        f"{fmt(settings.get('num_blocks'))} blocks of {fmt(settings.get('block_size'))}"
    )
    what = (
        "Pictures: a path, a fingerprint, a class code of "
        f"{codes} and an instance code of 64 blocks of 16 each; ReLU-Gaussian "
        "class queries and Gaussian instance queries (dense, as FC0's logits), "
        "each answered by both codes with its fingerprint as `subic search` "
        "answers"
        if pictures
        else f"Uniform random codes of {codes}, ReLU-Gaussian queries"
    )
    lines = [
        f"{what}, k = {fmt(settings.get('k'))}; Milvus Lite in a local file "
        f"against {local} in memory, on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')}.",
        "",
    ]
    agreement = (
        ("milvus_same_first_10", "the same first 10 as ImageIndex")
        if pictures
        else ("milvus_recall_at_100_vs_subic_index", "recall@100 vs SubicIndex")
    )
    body = []
    for row in data["results"]:
        for name, label in (("milvus_lite", "Milvus Lite"), (local_key, local)):
            entry = row[name]
            body.append(
                [
                    row["num_items"],
                    label,
                    entry["insert_items_per_second"],
                    entry["qps_batch_1"],
                    entry["qps_batch"],
                    row[agreement[0]] if name == "milvus_lite" else None,
                ]
            )
    lines += table(
        [
            "items",
            "backend",
            "inserts/s",
            "queries/s @ batch 1",
            f"queries/s @ batch {fmt(settings.get('batch'))}",
            agreement[1],
        ],
        body,
    )
    return lines


def render_encode_speed(data: dict) -> list[str]:
    results = data["results"]
    batches = sorted({r["batch"] for r in results})
    methods = []
    for r in results:
        if r["method"] not in methods:
            methods.append(r["method"])
    rate = {(r["method"], r["batch"]): r["images_per_second"] for r in results}
    lines = ["Images encoded per second.", ""]
    lines += table(
        ["method", *(f"batch {b}" for b in batches)],
        [[m, *(rate.get((m, b)) for b in batches)] for m in methods],
    )
    if isinstance(data.get("size_bytes"), dict):
        lines += table(
            ["artifact", "size (bytes)"],
            [[k, v] for k, v in data["size_bytes"].items()],
        )
    return lines


def render_export_parity(data: dict) -> list[str]:
    results = data["results"]
    columns = [
        "block_agreement",
        "images_with_all_blocks_equal",
        "mismatched_blocks",
        "max_abs_z_diff",
        "relative_z_error",
    ]
    lines = table(
        ["export", *columns],
        [[name, *(r.get(c) for c in columns)] for name, r in results.items()],
    )
    if isinstance(data.get("retrieval_map"), dict):
        measure = data.get("settings", {}).get("map", "")
        name = "copies found first" if measure.startswith("recall") else "retrieval mAP"
        lines += table(
            ["encoder", name], list(map(list, data["retrieval_map"].items()))
        )
    if isinstance(data.get("targets"), dict):
        lines += table(["target", "met"], list(map(list, data["targets"].items())))
    return lines


def render_train_overhead(data: dict) -> list[str]:
    best = data["best_images_per_second"]
    seconds = data.get("seconds_per_cifar10_epoch", {})
    lines = [
        f"{data.get('backbone', '')} on {data.get('dataset', '')}, batch "
        f"{fmt(data.get('batch_size'))}, {fmt(data.get('bits'))} bits, measured on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')}; "
        f"`subic train` / plain classifier = "
        f"{fmt(data.get('subic_train_over_plain_classifier'))}.",
        "",
    ]
    lines += table(
        ["training", "best images/s", "seconds per CIFAR-10 epoch"],
        [[kind, rate, seconds.get(kind)] for kind, rate in best.items()],
    )
    return lines


def _options(data: dict) -> str:
    """The `--block-size` and `--pretrain-epochs` a recipe run was given,
    where they are not today's defaults."""
    from subic_keras.config import Recipe, TrainConfig

    size, epochs = data.get("block_size"), data.get("pretrain_epochs")
    given = []
    if size and size != TrainConfig.block_size:
        given.append(f"`--block-size {size}`")
    if epochs and epochs != Recipe().pretrain_epochs:
        given.append(f"`--pretrain-epochs {epochs}`")
    return "".join(f" and {option}" for option in given)


def render_train_recipe(data: dict) -> list[str]:
    lines = [
        f"`subic train` with its defaults{_options(data)} at "
        f"{fmt(data.get('bits'))} bits, then "
        f"`subic evaluate --protocol paper`; {data.get('map_definition', '')}; "
        f"measured on {data.get('machine', {}).get('cpu', 'an unrecorded CPU')}.",
        "",
    ]
    rows = []
    for run in data["runs"]:
        test = run["test_map"]
        rows.append(
            [
                run["seed"],
                run["summary"]["query"],
                test["saved"]["map"],
                test["fc0"]["map"],
                test["class_posterior"]["map"],
                run["train_wall_seconds"],
                run["load_average_1min"]["start"],
            ]
        )
    lines += table(
        [
            "seed",
            "query chosen",
            "mAP (chosen query)",
            "mAP z*",
            "mAP class-posterior",
            "training s",
            "load at start",
        ],
        rows,
    )
    lines.append(
        f"Mean mAP {data['mean_test_map']:.4f} ± {data['std_test_map']:.4f} "
        f"over {len(data['runs'])} seed(s); the paper: {fmt(data.get('paper_map'))}."
    )
    cached = [str(run["seed"]) for run in data["runs"] if run.get("pretrain_cached")]
    if cached:
        lines.append(
            f"Seed(s) {', '.join(cached)} took the pre-trained backbone from a "
            "cache shared with another block size (`--cache-dir`): their "
            "training s are SuBiC's stage alone."
        )
    return lines


def render_serve_load(data: dict) -> list[str]:
    single = data["in_process"]
    goals = data["goals"]
    lines = [
        f"`subic serve` on {data['items']:,} random {data['bits']}-bit codes "
        f"(M = {data['num_blocks']}, K = {data['block_size']}, k = {data['k']}), "
        "clients on the same machine over loopback (keep-alive HTTP), on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')} "
        f"(SIMD flags: {', '.join(data.get('cpu_flags') or ['none recorded'])}; "
        f"{data.get('machine', {}).get('cpu_count', '?')} cores shared by "
        "server and clients; "
        + (
            f"scanner {data['scanner']}). "
            if data.get("scanner")
            else f"native kernel {data['native_kernel']}). "
            if data.get("native_kernel")
            else "faiss's scan, the native one off or not built). "
        )
        + "`query`: `POST /search/query` with a query vector; `image`: `POST "
        "/search` with a 32x32 PNG, decoded and encoded by the model. In the "
        f"same run, in-process `SubicIndex.search` of one query took "
        f"{fmt(single['p50_ms'])} ms (p50), {fmt(single['p99_ms'])} ms (p99); "
        f"a query request's p50 at one client is "
        f"{fmt(goals['query_p50_over_in_process_p50'])}x that"
        + (
            f", of which {fmt(goals['query_p50_outside_server_ms'])} ms were spent "
            "outside the server's own work (HTTP on loopback, uvicorn, the thread "
            "pool, JSON)."
            if "query_p50_outside_server_ms" in goals
            else "."
        ),
        "",
    ]
    lines += table(
        ["request", "clients", "p50 (ms)", "p99 (ms)", "requests/s", "errors"],
        [
            [
                r["kind"],
                r["clients"],
                r["p50_ms"],
                r["p99_ms"],
                r["requests_per_second"],
                r["errors"],
            ]
            for r in data["load"]
        ],
    )
    return lines


def render_stream_training(data: dict) -> list[str]:
    ratios = data["ratios"]
    lines = [
        f"One SuBiC epoch ({data.get('model', '')}) from PNG files in class "
        "folders, streamed by `datasets.image_folder`, and from in-memory "
        f"arrays, each in its own process, on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')} "
        f"({data.get('machine', {}).get('cpu_count', '?')} cores). Peak RSS "
        f"of 50,000 files over 5,000: {fmt(ratios['rss_50000_over_5000'])}x; "
        "training pictures/s from the 50,000 files over the arrays: "
        f"{fmt(ratios['speed_folder_over_arrays'])}x.",
        "",
    ]
    lines += table(
        [
            "source",
            "backbone",
            "training pictures",
            "pictures/s",
            "peak RSS (MB)",
            "check s",
        ],
        [
            [
                name.split("_")[0] + " " + name.split("_")[1],
                case.get("backbone", "DSH CNN at 32x32"),
                case["num_train"],
                case["images_per_second"],
                round(case["peak_rss_kb"] / 1024),
                case["prepare_seconds"],
            ]
            for name, case in data["cases"].items()
        ],
    )
    return lines


def render_folder_training(data: dict) -> list[str]:
    budget = data["budget"]
    lines = [
        f"`subic train --images` on CIFAR-10's training set written as PNG "
        f"class folders, against `subic train --dataset cifar10`, at "
        f"{budget['pretrain_epochs']} + {budget['epochs']} epochs and "
        f"{budget['bits']} bits; {data.get('map_definition', '')}; measured on "
        f"{data.get('machine', {}).get('cpu', 'an unrecorded CPU')}. Mean "
        f"difference {data['difference']:+.4f}; the largest range between "
        f"seeds of one kind {data['largest_seed_range']:.4f}.",
        "",
    ]
    rows = [
        [kind, run["seed"], run["test_map"], run["query"], run["train_seconds"]]
        for kind, runs in data["runs"].items()
        for run in runs
    ]
    lines += table(["trained from", "seed", "test mAP", "query", "training s"], rows)
    return lines


def render_filter_speed(data: dict) -> list[str]:
    settings, machine = data.get("settings", {}), data.get("machine", {})
    lines = [
        f"Filtered search on {fmt(settings.get('num_items'))} codes "
        f"({fmt(settings.get('distinct_codes'))} distinct; M = "
        f"{settings.get('num_blocks')}, K = {settings.get('block_size')}), "
        f"k = {settings.get('k')}, on {machine.get('cpu', 'an unrecorded CPU')}: "
        f"queries/s in batches of {fmt(settings.get('batch'))}, the median "
        "milliseconds of one query, and the time against the same scanner's "
        "unfiltered search (lower is faster). `where=` filters inside the scan; "
        "search-then-filter asks for k / share results and filters them, as "
        "one would without `where=`. Every filtered result was checked against "
        "a float64 brute force over the kept items.",
        "",
    ]
    lines += table(
        [
            "scanner",
            "kept",
            "where= q/s",
            "× unfiltered time",
            "single ms",
            "search-then-filter q/s",
            "× unfiltered time",
            "single ms",
        ],
        [
            [
                r["scanner"],
                f"{100 * r['share']:g} %",
                r["filtered_qps"],
                r["time_vs_unfiltered"],
                r["filtered_single_ms"],
                r["post_filter_qps"],
                r["post_filter_time_vs_unfiltered"],
                r["post_filter_single_ms"],
            ]
            for r in data["rows"]
        ],
    )
    return lines
