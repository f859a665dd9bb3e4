"""The README's results table: one row per headline result, from the
benchmarks' JSON files (`python -m benchmarks.make_results --readme
README.md`); `benchmarks/results/RESULTS.md` has every table."""

from __future__ import annotations

from benchmarks.markdown import cpu_of, table, target_parts


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


def _summary_search_speed(data: dict) -> tuple[str, str]:
    ratios = {}
    for t in data.get("targets", []):
        source, _, block, kernel = target_parts(t)
        if source == "random":
            ratios.setdefault(kernel, []).append(f"{block} {t['ratio']:.2g}x")
    figure = "; ".join(
        f"{kernel.removeprefix('native-')}: {', '.join(parts)}"
        for kernel, parts in ratios.items()
    )
    return "exact search against faiss Hamming at equal bits, 1M codes", figure


def _summary_instance_scan(data: dict) -> tuple[str, str]:
    """One shape of random codes (the instance code's), by batch size."""
    rows = [
        r
        for r in data["ratios"]
        if r["data"] == "random" and r["method"].startswith("native-")
    ]
    first = rows[0]
    batches = sorted({r["batch"] for r in rows}, reverse=True)
    by_kernel: dict[str, dict[int, float]] = {}
    for r in rows:
        by_kernel.setdefault(r["method"], {})[r["batch"]] = r["qps_over_hamming"]
    figure = "; ".join(
        f"{kernel.removeprefix('native-')} "
        + " / ".join(f"{ratios[b]:.2f}x" for b in batches)
        for kernel, ratios in by_kernel.items()
    )
    what = (
        f"instance scan ({first['bits']} bits, {first['num_blocks']} blocks of "
        f"{first['block_size']}) against faiss Hamming at equal bits, "
        f"{data['settings']['num_items']:,} codes, batches of "
        + " / ".join(f"{b:,}" for b in batches)
    )
    return what, figure


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


def _summary_serve_load(data: dict) -> tuple[str, str]:
    goals = data["goals"]
    outside = goals.get("query_p50_outside_server_ms")
    return (
        f"`subic serve`, {data['items']:,} codes",
        f"a query request {goals['query_p50_over_in_process_p50']}x in-process "
        "search"
        + (f" ({outside} ms of it HTTP and JSON)" if outside is not None else "")
        + f"; {goals['image_requests_per_second']} picture requests/s",
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


def _summary_held_out_families(data: dict) -> tuple[str, str]:
    results, settings = data["results"], data["settings"]
    named = [name for name in settings["held_out"] if name in results]
    return (
        "copies altered by a family the instance code never saw (recall@1 at "
        f"60,000 pictures; trained on it: in brackets), {settings['epochs']} epochs",
        "; ".join(
            f"{name} {results[name]['held out 60k']['recall@1']:.3f} "
            f"({results[name]['reference 60k']['recall@1']:.3f})"
            for name in named
        ),
    )


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


def _unseen_budget(settings: dict) -> str:
    epochs = (settings["pretrain_epochs"], settings["epochs"])
    counts = f"{epochs[0]} pre-training + {epochs[1]} SuBiC epochs"
    if settings.get("budget") != "subic train's defaults":
        return counts
    # Files written before the values were recorded hold `None` for both.
    return "`subic train`'s defaults" + ("" if None in epochs else f" ({counts})")


def _summary_unseen_classes(data: dict) -> tuple[str, str]:
    means, settings = data["mean_map"], data["settings"]
    key = max((k for k in means if k.startswith("unseen")), key=lambda k: int(k[7:]))
    rows, bits = means[key], key.split()[1]
    paper = means.get(f"paper {bits}", {})
    return (
        f"mAP on CIFAR-10 classes held out of training (unseen), {bits} bits, "
        + _unseen_budget(settings)
        + f", K = {settings.get('block_size', 64)}"
        + (
            f", split {settings['splits'][0]}"
            if len(settings["splits"]) == 1
            else f", splits {settings['splits']}"
        ),
        f"SuBiC z {rows['subic_z']:.3f}, one-hot classifier "
        f"{rows['one_hot_classifier']:.3f}, "
        + (f"DSH {rows['dsh']:.3f}, " if "dsh" in rows else "")
        + f"PQ {rows['pq']:.3f}, OPQ "
        f"{rows['opq']:.3f}; standard protocol: SuBiC z "
        f"{paper.get('subic_z', float('nan')):.3f}, "
        + (
            f"class posterior {paper['subic_class_posterior']:.3f}, "
            if "subic_class_posterior" in paper
            else ""
        )
        + "one-hot classifier "
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


def _summary_folder_copies(data: dict) -> tuple[str, str]:
    folder, model, found = data["folder_rule"], data["model_rule"], data["duplicates"]

    def marks(rule: dict) -> str:
        if not rule["marked"]:
            return "none marked"
        return (
            f"{rule['precision']:.3f} precise, {rule['coverage']:.3f} of copies marked"
        )

    return (
        f"copy marks in a folder of {data['pictures']:,} {data['dataset']} "
        "pictures the shipped code never saw, rules chosen on it (the "
        "validation rule in brackets)",
        f"recall@1 {folder['recall_at_1']:.3f}; {marks(folder)} ({marks(model)}); "
        f"duplicates list {found['exact_listed']:.0%} of exact, "
        f"{found['altered_listed']:.0%} of altered copies, "
        f"{found['wrong_share']:.0%} wrong pairs",
    )


_SUMMARIES = {
    "cifar10_retrieval.json": _summary_cifar10,
    "unseen_classes.json": _summary_unseen_classes,
    "unseen_classes_splits.json": _summary_unseen_classes,
    "unseen_classes_k16.json": _summary_unseen_classes,
    "unseen_classes_full.json": _summary_unseen_classes,
    "unseen_classes_full_splits.json": _summary_unseen_classes,
    "train_recipe.json": _summary_train_recipe,
    "search_speed.json": _summary_search_speed,
    "search_speed_avx2_256.json": _summary_instance_scan,
    "filter_speed.json": _summary_filter_speed,
    "near_duplicates.json": _summary_near_duplicates,
    "held_out_families.json": _summary_held_out_families,
    "folder_copies_fashion_mnist.json": _summary_folder_copies,
    "folder_copies_cifar10.json": _summary_folder_copies,
    "cold_start.json": _summary_cold_start,
    "cold_start_random.json": _summary_cold_start,
    "ray_search.json": _summary_ray_search,
    "ray_folders.json": _summary_ray_folders,
    "serve_load.json": _summary_serve_load,
    "stream_training.json": _summary_stream_training,
    "folder_training.json": _summary_folder_training,
}


# Files whose row another file gives better where it is there: the unseen
# classes averaged over more splits, and with subic train's blocks of 16,
# not of 64.
_SUPERSEDED = {
    "unseen_classes.json": "unseen_classes_splits.json",
    "unseen_classes_splits.json": "unseen_classes_k16.json",
    "unseen_classes_full.json": "unseen_classes_full_splits.json",
}


def _summary_rows(results: dict) -> list[list]:
    """One row per headline result: what, the figure, the CPU."""
    return [
        [*summary(results[name]), cpu_of(results[name])]
        for name, summary in _SUMMARIES.items()
        if name in results and _SUPERSEDED.get(name) not in results
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
