"""Writes `benchmarks/results/RESULTS.md` from the benchmarks' JSON results.

Every number in the Markdown is read from a JSON file in the results
directory; nothing is typed in by hand. Each section names the command that
reproduces it and its wall time. Known files get a dedicated table; any other
`*.json` (or a known one whose structure has changed) is rendered
generically from its lists and dictionaries of numbers. Missing files are
skipped.

    python -m benchmarks.make_results
    python -m benchmarks.make_results --results-dir /tmp/results --output /tmp/R.md
"""

from __future__ import annotations

import argparse
import glob
import json
import os

from benchmarks import common
from benchmarks.markdown import header, render_generic, table
from benchmarks.render_paper import (
    render_cifar10,
    render_cross_domain,
    render_unseen_classes,
)
from benchmarks.render_systems import (
    render_encode_speed,
    render_export_parity,
    render_filter_speed,
    render_folder_training,
    render_milvus_speed,
    render_omp_policy,
    render_search_speed,
    render_serve_load,
    render_stream_training,
    render_train_overhead,
    render_train_recipe,
)

HERE = os.path.dirname(os.path.abspath(__file__))

KNOWN = {
    "cifar10_retrieval.json": ("CIFAR-10 category retrieval (Table 2)", render_cifar10),
    "cross_domain.json": (
        "Cross-domain category retrieval (Table 3)",
        render_cross_domain,
    ),
    "unseen_classes.json": (
        "Codes that transfer: classes held out of training",
        render_unseen_classes,
    ),
    "search_speed.json": ("Search speed", render_search_speed),
    "filter_speed.json": ("Filtered search", render_filter_speed),
    "milvus_speed.json": ("Search on Milvus Lite", render_milvus_speed),
    "encode_speed.json": ("Encoding speed", render_encode_speed),
    "export_parity.json": ("Export parity", render_export_parity),
    "export_parity_instance.json": (
        "Export parity of the shipped instance code",
        render_export_parity,
    ),
    "train_overhead.json": ("Training overhead", render_train_overhead),
    "train_recipe.json": ("`subic train` defaults", render_train_recipe),
    "serve_load.json": ("Serving under load", render_serve_load),
    "stream_training.json": ("Training from a folder", render_stream_training),
    "folder_training.json": (
        "Folder against arrays: the same mAP",
        render_folder_training,
    ),
    "omp_policy.json": (
        "OpenMP's wait policy and the search ratios",
        render_omp_policy,
    ),
    "serve_load_faiss.json": (
        "Serving under load with faiss's scan (`--scanner faiss`)",
        render_serve_load,
    ),
}


def _cpu(data: dict) -> str:
    """The CPU a result was measured on, with its SIMD level where recorded."""
    machine = data.get("machine", {})
    cpu = machine.get("cpu", "unrecorded CPU")
    flags = set(machine.get("simd_flags") or data.get("cpu_flags") or [])
    if "avx512vbmi" in flags:
        return f"{cpu}, AVX-512 VBMI"
    if "avx512f" in flags:
        return f"{cpu}, AVX-512"
    if "avx2" in flags:
        return f"{cpu}, AVX2, no AVX-512"
    if machine.get("faiss_simd_level"):
        return f"{cpu} (faiss {machine['faiss_simd_level']})"
    return cpu


def _summary_cifar10(data: dict) -> tuple[str, str]:
    entries = data["comparison"]["bits"]
    ours = " / ".join(f"{e['subic']['map']:.3f}" for e in entries)
    paper = " / ".join(f"{e['paper_subic']:.3f}" for e in entries)
    bits = "/".join(str(e["bits"]) for e in entries)
    return (
        f"CIFAR-10 retrieval (Table 2), strict mAP at {bits} bits",
        f"{ours} (paper {paper})",
    )


def _summary_train_recipe(data: dict) -> tuple[str, str]:
    return (
        f"`subic train` defaults, {data['bits']} bits, {len(data['runs'])} seeds",
        f"mAP {data['mean_test_map']:.4f} ± {data['std_test_map']:.4f}, "
        f"{data['max_train_wall_seconds'] / 60:.0f} min per training",
    )


def _target_parts(target: dict) -> list[str]:
    """A search target's data, bits, block size and kernel, from its text
    ("random, 64 bits, K=16, native-avx2: >= 1.5x hamming")."""
    return [part.strip() for part in target["target"].split(":")[0].split(",")]


def _summary_search_speed(data: dict) -> tuple[str, str]:
    ratios = {}
    for t in data.get("targets", []):
        source, _, block, kernel = _target_parts(t)
        if source == "random":
            ratios.setdefault(kernel, []).append(f"{block} {t['ratio']:.2g}x")
    figure = "; ".join(
        f"{kernel.removeprefix('native-')}: {', '.join(parts)}"
        for kernel, parts in ratios.items()
    )
    return "exact search against faiss Hamming at equal bits, 1M codes", figure


def _summary_filter_speed(data: dict) -> tuple[str, str]:
    best = [r for r in data["rows"] if r["scanner"] == data["rows"][0]["scanner"]]
    figure = ", ".join(
        f"{100 * r['share']:g} %: {r['time_vs_unfiltered']:.2f}x" for r in best
    )
    what = (
        f"filtered search (`where=`), time against unfiltered, "
        f"{best[0]['scanner']}, {data['settings']['num_items']:,} codes"
    )
    return what, figure


def search_kernel_table(data: dict) -> list[str]:
    """Each native kernel against Hamming, batches of 1,000 queries."""
    rows = {}
    for t in data.get("targets", []):
        source, bits, block, kernel = _target_parts(t)
        label = "1M random codes" if source == "random" else "CIFAR-10 codes"
        column = f"{label}, {bits}, {block}"
        rows.setdefault(kernel, {})[column] = f"{t['ratio']:.2f}x"
    columns = list(dict.fromkeys(c for by in rows.values() for c in by))
    machine = data.get("machine", {})
    # The flags the kernels ask for (all of them are in the JSON).
    wanted = ("avx2", "avx512bw", "avx512vbmi", "asimd")
    flags = ", ".join(f for f in machine.get("simd_flags") or [] if f in wanted)
    flags = flags or "unrecorded"
    lines = [
        "Exact search, each native kernel forced, as a multiple of faiss's "
        "Hamming scan at equal bits (queries per second, batches of 1,000, "
        f"k = 100, one run of `python -m benchmarks.search_speed` on "
        f"{machine.get('cpu', 'an unrecorded CPU')}, SIMD flags {flags}, "
        f"OpenMP wait policy {machine.get('omp_wait_policy') or 'unset'}):",
        "",
    ]
    return lines + table(
        ["kernel", *columns],
        [[kernel, *(by.get(c) for c in columns)] for kernel, by in rows.items()],
    )


def _summary_serve_load(data: dict) -> tuple[str, str]:
    goals = data["goals"]
    return (
        f"`subic serve`, {data['items']:,} codes",
        f"a query request {goals['query_p50_over_in_process_p50']}x in-process "
        f"search; {goals['image_requests_per_second']} picture requests/s",
    )


def _summary_stream_training(data: dict) -> tuple[str, str]:
    ratios = data["ratios"]
    return (
        "training from 50,000 PNG files",
        f"peak memory {ratios['rss_50000_over_5000']}x that of 5,000; "
        f"{ratios['speed_folder_over_arrays']}x the speed of arrays",
    )


def _summary_folder_training(data: dict) -> tuple[str, str]:
    means = data["mean_test_map"]
    return (
        "`--images` folder against `--dataset cifar10`, same budget",
        f"strict mAP {means['folder']:.4f} against {means['arrays']:.4f} "
        f"(seeds range up to {data['largest_seed_range']:.4f})",
    )


# The README's headline results, in order: file, and what to say of it.
def _summary_refine(data: dict) -> tuple[str, str]:
    test, default = data["test"], data["look"]["default"]
    near, categories = test["near_duplicates"], test["category_map"]
    cost = data["cost"]["k=10"]
    return (
        "ties ordered by look: near-duplicate recall@1, strict mAP 48 bits, cost",
        f"recall@1 {near['codes_only']['recall@1']:.3f} codes only, "
        f"{near[default]['recall@1']:.3f} refined; mAP "
        f"{categories['codes_only']:.4f} / {categories[default]:.4f}; "
        f"{cost['batch_ratio']:.2f}x time on {data['cost']['items']:,} codes, "
        f"+{data['look']['bytes']} bytes per item",
    )


def _summary_near_duplicates(data: dict) -> tuple[str, str]:
    whole, settings = data["results"]["whole family"], data["settings"]
    peers = [key[: -len(" 60k")] for key in whole if key.endswith(" 60k")]
    return (
        f"copies found first (recall@1), {settings['bits']}-bit instance code "
        "against peers, 1,000 copies, 10,000 / 60,000 pictures",
        "; ".join(
            f"{peer} {whole[peer + ' 10k']['recall@1']:.3f} / "
            f"{whole[peer + ' 60k']['recall@1']:.3f}"
            for peer in peers
        ),
    )


def near_duplicates_table(data: dict) -> list[str]:
    """Recall@1 of every method on every set of copies, at 10k and 60k."""
    results, settings = data["results"], data["settings"]
    methods = list(next(iter(results.values())))
    lines = [
        f"Copies found first: recall@1 over {settings['queries']:,} altered "
        f"CIFAR-10 test pictures, databases of 10,000 and 60,000 pictures; an "
        f"instance code of {settings['bits']} bits (M = {settings['num_blocks']}, "
        f"K = {settings['block_size']}) trained {settings['epochs']} epochs on "
        f"{settings['train_pictures']:,} pictures without labels, on "
        f"{_cpu(data)}:",
        "",
    ]
    rows = [
        [name, *(f"{row[m]['recall@1']:.3f}" if m in row else "—" for m in methods)]
        for name, row in results.items()
    ]
    lines += table(["copies", *methods], rows)
    marks, rules = data.get("copy_marks"), data.get("calibration")
    if marks and rules:
        lines += [
            "",
            f"Copy marks (`subic_keras.copies`): a result is marked a copy from a "
            f"copy margin of {rules['copy_margin']['value']}, chosen for "
            f"{rules['precision_target']:.0%} precision on copies of training "
            "pictures. On the whole-family queries' 10 best results, precision "
            + " and ".join(
                f"{m['precision']:.3f} / recall {m['recall']:.3f} at {name}"
                for name, m in marks.items()
            )
            + f"; copies of pictures outside the 10k database marked: "
            f"{marks['10k']['queries_outside_marked']:.3f} of them.",
        ]
    return lines


def held_out_families_table(data: dict) -> list[str]:
    """Recall@1 of the code that never saw a family beside the one that did."""
    settings = data["settings"]
    lines = [
        f"Leave one family out: recall@1 over {settings['queries']:,} CIFAR-10 "
        "test pictures altered by one family (or its group mixed), among 10,000 "
        "and 60,000 pictures; each held-out code trained without its group, the "
        f"reference on the whole family, both {settings['epochs']} epochs on "
        f"{settings['train_pictures']:,} pictures ({settings['bits']} bits), "
        f"on {_cpu(data)}:",
        "",
    ]
    columns = [f"{who} {size}" for size in ("10k", "60k") for who in ("held out",
               "reference")]  # fmt: skip
    rows = [
        [name, row["held out group"], *(f"{row[c]['recall@1']:.3f}" for c in columns)]
        for name, row in data["results"].items()
    ]
    return lines + table(["copies", "group held out", *columns], rows)


def _summary_cold_start(data: dict) -> tuple[str, str]:
    kernel, kinds = next(iter(data["kernels"].items()))
    if "grouping_in_file" not in kinds:  # written before version 5 files
        kinds = {"grouped_on_first_search": kinds}
    stored = kinds.get("grouping_in_file")
    plain_kind = next(k for k in kinds if k != "grouping_in_file")
    plain = kinds[plain_kind]["single"]
    without = (
        f"{plain['first_over_warm']:.1f}x ({plain['first_s'] * 1000:.2f} ms; load "
        f"{plain['load_s']:.2f} s) from a file without it"
        if plain_kind == "no_grouping_in_file"  # laid out at load
        else f"{plain['first_s'] * 1000:.0f} ms from a file without its grouping "
        f"({plain['first_over_warm']:.0f}x warm)"
    )
    saved = "with its grouping in the file"
    if data.get("distinct_codes") == data["items"]:
        saved = "as saved (no grouping: they hardly repeat)"
    if stored is None:
        figure = without
    else:
        figure = (
            f"{stored['single']['first_over_warm']:.1f}x a warm one "
            f"({stored['single']['first_s'] * 1000:.2f} ms; load "
            f"{stored['single']['load_s']:.2f} s) {saved}, {without}"
        )
    codes = data.get("codes", "trained") + "-like" * (data.get("codes") != "random")
    return (
        f"first search after loading {data['items']:,} {codes} codes ({kernel})",
        figure,
    )


def _summary_unseen_classes(data: dict) -> tuple[str, str]:
    means, settings = data["mean_map"], data["settings"]
    key = max((k for k in means if k.startswith("unseen")), key=lambda k: int(k[7:]))
    rows, bits = means[key], key.split()[1]
    paper = means.get(f"paper {bits}", {})
    return (
        f"mAP on CIFAR-10 classes held out of training (unseen), {bits} bits, "
        + (
            "`subic train` defaults"
            if settings["pretrain_epochs"] is None and settings["epochs"] is None
            else f"{settings['pretrain_epochs']} pre-training + {settings['epochs']} "
            f"SuBiC epochs, splits {settings['splits']}"
        ),
        f"SuBiC z {rows['subic_z']:.3f}, one-hot classifier "
        f"{rows['one_hot_classifier']:.3f}, PQ {rows['pq']:.3f}, OPQ "
        f"{rows['opq']:.3f}; standard protocol: SuBiC "
        f"{paper.get('subic_z', float('nan')):.3f}, one-hot classifier "
        f"{paper.get('one_hot_classifier', float('nan')):.3f}"
        + _expected_ties(data.get("mean_map_expected", {}).get(key)),
    )


def _expected_ties(rows: dict | None) -> str:
    """The unseen-class figures with ties in expectation, where recorded."""
    if not rows:
        return ""
    return (
        f"; unseen, ties in expectation: SuBiC z {rows['subic_z']:.3f}, "
        f"one-hot classifier {rows['one_hot_classifier']:.3f}"
    )


def _summary_ray_search(data: dict) -> tuple[str, str]:
    results = data["results"]
    four, recovery = results["ray_4_shards"], results["ray_4_shards"]["recovery"]
    return (
        f"Ray shards against one index, {data['items']:,} codes",
        f"4 shards {four['throughput_ratio']:.2f}x throughput, "
        f"+{four['added_single_ms']:.1f} ms a single query; actor killed: "
        f"{recovery['failed_or_inexact']} failed, longest search "
        f"{recovery['longest_search_s']:.1f} s",
    )


def _summary_ray_folders(data: dict) -> tuple[str, str]:
    return (
        f"a folder of {data['pictures']:,} pictures encoded on Ray Data",
        f"{data['ray_pictures_per_s']:.0f} pictures/s against "
        f"{data['index_folder_pictures_per_s']:.0f} in one process "
        f"({data['ray_over_index_folder']:.2f}x, one machine); same codes: "
        f"{'yes' if data['same_codes'] else 'no'}",
    )


_SUMMARIES = {
    "cifar10_retrieval.json": _summary_cifar10,
    "unseen_classes.json": _summary_unseen_classes,
    "train_recipe.json": _summary_train_recipe,
    "search_speed.json": _summary_search_speed,
    "filter_speed.json": _summary_filter_speed,
    "refine.json": _summary_refine,
    "near_duplicates.json": _summary_near_duplicates,
    "cold_start.json": _summary_cold_start,
    "cold_start_random.json": _summary_cold_start,
    "ray_search.json": _summary_ray_search,
    "ray_folders.json": _summary_ray_folders,
    "serve_load.json": _summary_serve_load,
    "stream_training.json": _summary_stream_training,
    "folder_training.json": _summary_folder_training,
}


def _summary_rows(results: dict) -> list[list]:
    """One row per headline result: what, the figure, the CPU."""
    return [
        [*summary(results[name]), _cpu(results[name])]
        for name, summary in _SUMMARIES.items()
        if name in results
    ]


def render_summary(results: dict) -> str:
    """The README's compact results table; RESULTS.md has every table."""
    lines = [
        "Every figure is read from `benchmarks/results/*.json` by `python -m "
        "benchmarks.make_results --readme README.md`; "
        "[benchmarks/results/RESULTS.md](benchmarks/results/RESULTS.md) has "
        "every table, the command that produced it and its settings.",
        "",
    ]
    lines += table(["result", "figure", "CPU (2 cores)"], _summary_rows(results))
    return "\n".join(lines).rstrip() + "\n"


def filter_table(data: dict) -> list[str]:
    """Filtered search against unfiltered and search-then-filter, per kernel."""
    settings, machine = data["settings"], data.get("machine", {})
    shares = sorted({r["share"] for r in data["rows"]}, reverse=True)
    by_scanner: dict = {}
    for r in data["rows"]:
        by_scanner.setdefault(r["scanner"], {})[r["share"]] = r

    def cell(r: dict | None) -> str:
        if r is None:
            return "—"
        after = r["post_filter_time_vs_unfiltered"]
        text = f"{after:,.0f}" if after >= 100 else f"{after:.3g}"
        return f"{r['time_vs_unfiltered']:.2f}x ({text}x)"

    lines = [
        f"Filtered search (`where=`, inside the scan), time as a multiple of the "
        f"same scanner's unfiltered search, and in parentheses search-then-"
        f"filter with k / share (batches of {settings['batch']:,}, k = "
        f"{settings['k']}, {settings['num_items']:,} codes of M = "
        f"{settings['num_blocks']}, K = {settings['block_size']}, one run of "
        f"`python -m benchmarks.filter_speed` on {machine.get('cpu', 'a CPU')}; "
        "every result checked exact):",
        "",
    ]
    lines += table(
        ["scanner"] + [f"{100 * s:g} % kept" for s in shares],
        [
            [scanner] + [cell(rows.get(s)) for s in shares]
            for scanner, rows in by_scanner.items()
        ],
    )
    return lines


def refine_table(data: dict) -> list[str]:
    """Codes only against codes refined by looks, on both tasks."""
    test, default = data["test"], data["look"]["default"]
    near, categories = test["near_duplicates"], test["category_map"]
    machine = data.get("machine", {})
    validation = data["validation"]
    chosen = (
        "the default"
        if validation["default_is_chosen"]
        else f"not the default: {validation['chosen']}"
    )
    lines = [
        "Ties ordered by look (`subic_keras.search.looks`: "
        f"{data['look']['bytes']} bytes of each picture's centre, compared with "
        "the query seen as itself and as crops and mirror images of its "
        "original, order the codes' best results), CIFAR-10 test set, "
        f"48-bit model {data['model']}, one run of `python -m benchmarks.refine` "
        f"on {machine.get('cpu', 'a CPU')}; the look and its settings "
        f"({default}) chosen on a validation split "
        f"({chosen}):",
        "",
    ]
    rows = []
    for name, key in (("codes only", "codes_only"), ("refined", default)):
        rows.append(
            [
                name,
                f"{near[key]['recall@1']:.3f}",
                f"{near[key]['recall@10']:.3f}",
                f"{categories[key]:.4f}",
            ]
        )
    lines += table(
        [
            "ranking",
            "near-duplicate recall@1",
            "recall@10",
            "strict mAP (paper protocol)",
        ],
        rows,
    )
    cost = data["cost"]
    # Seconds for 1,000 queries are milliseconds a query.
    batch, single = cost["k=10"]["batch_1000_s"], cost["k=10"]["single_p50_ms"]
    lines += [
        "",
        "What bounds the refined recall: the look alone, over the whole "
        "database, finds the original first for "
        f"{near['look_alone_whole_database']['recall@1']:.3f} of the "
        "queries, and the codes' shortlist holds it for "
        f"{near['original_in_codes_shortlist']:.3f}, the tie groups of their "
        f"top 10 for {near['original_in_tie_groups_of_the_top_10']:.3f} (an "
        "altered copy's code moves away from its original's: near copies are "
        "found in the shortlist, not among ties alone).",
        "",
        f"Cost on {cost['items']:,} trained-like codes (tie groups up to "
        f"{cost['largest_tie_group']:,}): k = 10, refined "
        f"{cost['k=10']['batch_ratio']:.2f}x the time of codes only in batches "
        f"of 1,000 ({batch['refined']:.2f} ms a query against "
        f"{batch['codes_only']:.4f}), "
        f"{cost['k=10']['single_ratio']:.2f}x for one query "
        f"({single['refined']:.2f} ms against {single['codes_only']:.3f}); "
        f"{cost['bytes_per_item']['refined']} bytes per item against "
        f"{cost['bytes_per_item']['codes_only']}."
        + (
            " Each native kernel forced: "
            + "; ".join(
                f"{name}: {entry['k=10']['batch_ratio']:.0f}x batches, "
                f"{entry['k=10']['single_ratio']:.1f}x one query"
                for name, entry in cost["kernels"].items()
            )
            + "."
            if cost.get("kernels")
            else ""
        ),
    ]
    return lines


def ray_table(data: dict) -> list[str]:
    """RayIndex with 1, 2 and 4 shards against one in-process index."""
    results, machine = data["results"], data.get("machine", {})
    base = results["in_process"]
    lines = [
        f"Sharded search on Ray (`RayIndex`, one actor per shard, a local Ray "
        f"on the same 2 cores) against one in-process `SubicIndex`, "
        f"{data['items']:,} trained-like codes, k = {data['k']}, one run of "
        f"`python -m benchmarks.ray_search` on {machine.get('cpu', 'a CPU')}:",
        "",
    ]
    rows = [
        ["in process", f"{base['queries_per_second']:.0f}", "1.00x",
         f"{base['single_p50_ms']:.2f}", f"{base['single_p99_ms']:.2f}", "—"]
    ]  # fmt: skip
    for shards in (1, 2, 4):
        r = results[f"ray_{shards}_shards"]
        rows.append(
            [
                f"Ray, {shards} shard{'s' if shards > 1 else ''}",
                f"{r['queries_per_second']:.0f}",
                f"{r['throughput_ratio']:.2f}x",
                f"{r['single_p50_ms']:.2f}",
                f"{r['single_p99_ms']:.2f}",
                f"{r['ray_memory_mb']:,.0f}",
            ]
        )
    lines += table(
        ["engine", "q/s (batches of 1,000)", "× in process", "single p50 ms",
         "single p99 ms", "Ray processes' memory MB"],
        rows,
    )  # fmt: skip
    model = data["billion_code_model"]
    lines += [
        "",
        "A model of 1,000,000,000 codes from these figures (a search costs "
        "the slowest shard's scan plus the fan-out): "
        + "; ".join(
            f"{name.replace('_', ' ').replace('1 machines', '1 machine')}: "
            f"{m['queries_per_second_batched']:,.1f} q/s "
            f"batched, about {m['single_query_ms_estimate']:,.0f} ms a query"
            for name, m in model.items()
        )
        + ".",
    ]
    return lines


# The tables the README carried before it kept to its summary table.
KNOWN["search_speed.json"] = (
    "Search speed",
    lambda data: [*render_search_speed(data), "", *search_kernel_table(data)],
)
KNOWN["filter_speed.json"] = (
    "Filtered search",
    lambda data: [*render_filter_speed(data), "", *filter_table(data)],
)
KNOWN["near_duplicates.json"] = (
    "Copies found first: an instance code",
    lambda data: [*near_duplicates_table(data), "", *render_generic(data)],
)
KNOWN["held_out_families.json"] = (
    "Leave one family out: alterations never trained on",
    lambda data: [*held_out_families_table(data), "", *render_generic(data)],
)
KNOWN["refine.json"] = (
    "Ties ordered by look",
    lambda data: [*refine_table(data), "", *render_generic(data)],
)
KNOWN["ray_search.json"] = (
    "Sharded search on Ray",
    lambda data: [*ray_table(data), "", *render_generic(data)],
)


def render(name: str, data) -> list[str]:
    title, renderer = KNOWN.get(name, (name[: -len(".json")], None))
    meta = data if isinstance(data, dict) else {}
    lines = header(title, name, meta)
    if renderer is not None:
        try:
            return lines + renderer(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
            lines += [
                f"(The file's structure is not the expected one ({error!r}); "
                "shown generically.)",
                "",
            ]
    return lines + render_generic(data)


def _read_results(results_dir: str) -> tuple[dict, list[str]]:
    """The JSON results of `results_dir` by file name (known files first),
    and the lines to show for unreadable ones."""
    present = {
        os.path.basename(p): p
        for p in sorted(glob.glob(os.path.join(results_dir, "*.json")))
    }
    order = [n for n in KNOWN if n in present]
    order += [n for n in present if n not in KNOWN]
    results, problems = {}, []
    for name in order:
        try:
            with open(present[name]) as handle:
                results[name] = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            problems += [f"### {name}", "", f"(unreadable: {error})", ""]
    return results, problems


def make_results(results_dir: str) -> str:
    """The Markdown of every JSON result in `results_dir`, known files first."""
    results, problems = _read_results(results_dir)
    lines = [
        "## Results",
        "",
        "Generated by `python -m benchmarks.make_results` from "
        "`benchmarks/results/*.json`; every number below is read from those "
        "files. Timings are on 2-core machines, often shared, and are "
        "indicative.",
        "",
    ]
    if not results and not problems:
        lines += ["No benchmark results found.", ""]
    for name, data in results.items():
        lines += render(name, data)
    lines += problems
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument(
        "--output", default=None, help="default: RESULTS.md in --results-dir"
    )
    parser.add_argument(
        "--readme",
        default=None,
        help="also replace the text between the README's results markers",
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(args.results_dir):
        parser.error(f"--results-dir not found: {args.results_dir!r}")
    output = args.output or os.path.join(args.results_dir, "RESULTS.md")
    text = make_results(args.results_dir)
    with common.atomic_output(output, suffix=".md") as tmp:
        with open(tmp, "w") as handle:
            handle.write(text)
    print(f"wrote {output}")
    if args.readme:
        update_readme(args.readme, render_summary(_read_results(args.results_dir)[0]))
        print(f"updated {args.readme}")
    return text


README_START = "<!-- results: generated by benchmarks/make_results.py -->"
README_END = "<!-- end of results -->"


def update_readme(path: str, text: str) -> None:
    """Replaces the README's section between the results markers with `text`."""

    with open(path, encoding="utf-8") as handle:
        readme = handle.read()
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(
            f"{path} has no results markers: add {README_START!r} and {README_END!r}"
        )
    body = text.strip()
    readme = readme[: start + len(README_START)] + "\n\n" + body + "\n\n" + readme[end:]
    with common.atomic_output(path, suffix=".md") as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(readme)


if __name__ == "__main__":
    main()
