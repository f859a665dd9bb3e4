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
from benchmarks.markdown import header, render_generic, table, target_parts
from benchmarks.render_copies import (
    held_out_families_table,
    near_duplicates_table,
    render_mobilenet_instance,
)
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
    render_shared_loads,
    render_stream_training,
    render_train_overhead,
    render_train_recipe,
)
from benchmarks.summary import render_summary

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
    "unseen_classes_splits.json": (
        "Codes that transfer: three splits of held-out classes",
        render_unseen_classes,
    ),
    "unseen_classes_k16.json": (
        "Codes that transfer: blocks of 16",
        render_unseen_classes,
    ),
    "unseen_classes_p16.json": (
        "Codes that transfer: twice the pre-training",
        render_unseen_classes,
    ),
    "unseen_classes_full.json": (
        "Codes that transfer: subic train's defaults",
        render_unseen_classes,
    ),
    "unseen_classes_full_splits.json": (
        "Codes that transfer: subic train's defaults, two splits",
        render_unseen_classes,
    ),
    "search_speed.json": ("Search speed", render_search_speed),
    "filter_speed.json": ("Filtered search", render_filter_speed),
    "milvus_speed.json": ("Search on Milvus Lite", render_milvus_speed),
    "milvus_pictures_speed.json": (
        "A folder's pictures on Milvus Lite",
        render_milvus_speed,
    ),
    "encode_speed.json": ("Encoding speed", render_encode_speed),
    "export_parity.json": ("Export parity", render_export_parity),
    "export_parity_instance.json": (
        "Export parity of the shipped instance code",
        render_export_parity,
    ),
    "train_overhead.json": ("Training overhead", render_train_overhead),
    "train_recipe.json": ("`subic train` defaults", render_train_recipe),
    "train_recipe_k64.json": (
        "`subic train --block-size 64`, the earlier default block size",
        render_train_recipe,
    ),
    "train_recipe_p50.json": (
        "`subic train --block-size 64 --pretrain-epochs 50`, the earlier defaults",
        render_train_recipe,
    ),
    "train_recipe_k16_p50.json": (
        "`subic train --block-size 16 --pretrain-epochs 50`",
        render_train_recipe,
    ),
    "serve_load.json": ("Serving under load", render_serve_load),
    "stream_training.json": ("Training from a folder", render_stream_training),
    "folder_training.json": (
        "Folder against arrays: the same mAP",
        render_folder_training,
    ),
    "folder_training_cached.json": (
        "Folder against arrays, each picture decoded once",
        render_folder_training,
    ),
    "omp_policy.json": (
        "OpenMP's wait policy and the search ratios",
        render_omp_policy,
    ),
    "shared_loads.json": (
        "Search speed: queries sharing code loads, a single query's split rows",
        render_shared_loads,
    ),
    "serve_load_faiss.json": (
        "Serving under load with faiss's scan (`--scanner faiss`)",
        render_serve_load,
    ),
}


def search_kernel_table(data: dict) -> list[str]:
    """Each native kernel against Hamming, batches of 1,000 queries."""
    rows = {}
    for t in data.get("targets", []):
        source, bits, block, kernel = target_parts(t)
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


# The README's headline results, in order: file, and what to say of it.


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
# Other shapes and CPUs, rendered as search_speed.json is.
for name, title in (
    # The 64-bit instance code's shape (M = 16, K = 16) on an AVX2-only CPU.
    ("search_speed_avx2_k16.json", "Search speed at 16 blocks of 16, AVX2 only"),
    # The instance code's shape at 128 bits (M = 32, K = 16) on the same CPU.
    (
        "search_speed_avx2_128.json",
        "Search speed at 32 blocks of 16 (128 bits), AVX2 only",
    ),
    (
        "search_speed_avx512_128.json",
        "Search speed at 32 blocks of 16 (128 bits), AVX-512",
    ),
    # The shipped instance code's shape, 256 bits (M = 64, K = 16).
    (
        "search_speed_avx512_256.json",
        "Search speed at 64 blocks of 16 (256 bits), AVX-512",
    ),
    # The same shape on an AVX2-only CPU, and before four queries shared each
    # load there (two did) and a single query split the rows among threads.
    (
        "search_speed_avx2_256.json",
        "Search speed at 64 blocks of 16 (256 bits), AVX2 only",
    ),
    (
        "search_speed_avx2_256_two_queries.json",
        "Search speed at 64 blocks of 16 (256 bits), AVX2 only, two queries a load",
    ),
    # The same command on the same kernels, run again a few sessions later.
    (
        "search_speed_avx2_256_again.json",
        "Search speed at 64 blocks of 16 (256 bits), AVX2 only, run again",
    ),
    # The same, each single query timed with the index out of the caches.
    (
        "search_speed_cold_128.json",
        "Search speed at 32 blocks of 16 (128 bits), AVX-512, caches swept",
    ),
    # `subic train`'s 48-bit codes: 12 blocks of 16 (today's default) and 8
    # blocks of 64 (the earlier one), measured one after the other.
    (
        "search_speed_48b_k16.json",
        "Search speed at 12 blocks of 16 (48 bits, `subic train`'s default)",
    ),
    (
        "search_speed_48b_k64.json",
        "Search speed at 8 blocks of 64 (48 bits, the earlier default)",
    ),
):
    KNOWN[name] = (title, KNOWN["search_speed.json"][1])
KNOWN["two_codes.json"] = (
    "Both codes in one index: the whole answer against the instance scan",
    render_generic,
)
KNOWN["two_codes_avx2.json"] = (
    "Both codes in one index, AVX2 only",
    render_generic,
)
KNOWN["filter_speed.json"] = (
    "Filtered search",
    lambda data: [*render_filter_speed(data), "", *filter_table(data)],
)


def _near_duplicates_section(data: dict) -> list[str]:
    return [*near_duplicates_table(data), "", *render_generic(data)]


KNOWN["near_duplicates.json"] = (
    "Copies found first: an instance code",
    _near_duplicates_section,
)
# The 128-bit code of 60 epochs (M = 32) that shipped before the 256-bit
# one; its command ran when 32 blocks were the benchmark's default.
KNOWN["near_duplicates_128.json"] = (
    "Copies found first: the 128-bit instance code shipped before",
    _near_duplicates_section,
)
# The 128-bit code of 20 epochs that shipped before the one of 60.
KNOWN["near_duplicates_e20.json"] = (
    "Copies found first: the 20-epoch instance code shipped before",
    _near_duplicates_section,
)
# 256 bits (M = 64), 20 epochs: the bits' effect at the 20-epoch budget.
KNOWN["near_duplicates_256.json"] = (
    "Copies found first: a 256-bit instance code, 20 epochs",
    _near_duplicates_section,
)
# The 64-bit code (M = 16) that shipped before the 128-bit one; its command
# ran when 16 blocks were the benchmark's default (`--num-blocks 16` now).
KNOWN["near_duplicates_64.json"] = (
    "Copies found first: the 64-bit instance code shipped before",
    _near_duplicates_section,
)
# The 20-epoch code, then shipped, trained 20 epochs more (`--start-from
# instance` named it then).
KNOWN["near_duplicates_restart.json"] = (
    "Copies found first: the 20-epoch instance code trained 20 epochs more",
    _near_duplicates_section,
)
# The 20-epoch code, then shipped, trained 10 epochs more from a third of
# the rate.
KNOWN["near_duplicates_restart_gentle.json"] = (
    "Copies found first: the 20-epoch instance code trained 10 epochs more at 3e-4",
    _near_duplicates_section,
)
# Trained as the shipped code, in batches of 1,024 pictures (more negatives).
KNOWN["near_duplicates_batch1024.json"] = (
    "Copies found first: an instance code trained in batches of 1,024",
    _near_duplicates_section,
)


def _held_out_section(data: dict) -> list[str]:
    return [*held_out_families_table(data), "", *render_generic(data)]


KNOWN["held_out_families.json"] = (
    "Leave one family out: alterations never trained on",
    _held_out_section,
)
# The reference alone, at the same budget, of DSH's CNN, of the same at 128
# bits, and of one twice as wide.
KNOWN["held_out_reference.json"] = (
    "Copies by family, 4 epochs: the DSH CNN",
    _held_out_section,
)
KNOWN["held_out_reference_m32.json"] = (
    "Copies by family, 4 epochs: 32 blocks of 16 (128 bits)",
    _held_out_section,
)
KNOWN["held_out_reference_width2.json"] = (
    "Copies by family, 4 epochs: a CNN twice as wide",
    _held_out_section,
)


def _mobilenet_section(data: dict) -> list[str]:
    return [*render_mobilenet_instance(data), *render_generic(data)]


KNOWN["mobilenet_instance.json"] = (
    "Copies found first: an instance code on MobileNet v1, fine-tuned",
    _mobilenet_section,
)
for _rate in ("5e-5", "1e-3"):
    KNOWN[f"mobilenet_instance_lr{_rate}.json"] = (
        f"Copies found first: MobileNet v1 fine-tuned at a learning rate of {_rate}",
        _mobilenet_section,
    )
KNOWN["picture_views.json"] = (
    "Copies found first with views of a picture (database and query side)",
    render_generic,
)
for _dataset in ("fashion_mnist", "cifar10"):
    KNOWN[f"folder_copies_{_dataset}.json"] = (
        f"Copy rules chosen on a folder of {_dataset} pictures",
        render_generic,
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
