"""Tables of the copy benchmarks: near duplicates, held-out families, and
the instance code on MobileNet v1 (`benchmarks/make_results.py` files them)."""

from __future__ import annotations

from benchmarks.markdown import cpu_of, table


def near_duplicates_table(data: dict) -> list[str]:
    """Recall@1 of every method on every set of copies, at 10k and 60k."""
    results, settings = data["results"], data["settings"]
    methods = list(next(iter(results.values())))
    lines = [
        f"Copies found first: recall@1 over {settings['queries']:,} altered "
        f"CIFAR-10 test pictures, databases of 10,000 and 60,000 pictures; an "
        f"instance code of {settings['bits']} bits (M = {settings['num_blocks']}, "
        f"K = {settings['block_size']}) on {_cnn(settings)}, trained "
        f"{settings['epochs']} epochs on "
        f"{settings['train_pictures']:,} pictures without labels, on "
        f"{cpu_of(data)}:",
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
            "Copy marks (`subic_keras.instance.copies`): a result is marked a "
            f"copy from a copy margin of {rules['copy_margin']['value']}, chosen for "
            f"{rules['precision_target']:.0%} precision on copies of training "
            "pictures. On the whole-family queries' 10 best results, precision "
            + " and ".join(
                f"{m['precision']:.3f} / recall {m['recall']:.3f} at {name}"
                for name, m in marks.items()
            )
            + f"; copies of pictures outside the 10k database marked: "
            f"{marks['10k']['queries_outside_marked']:.3f} of them.",
        ]
        if "wrong_marks" in marks["10k"]:  # (recorded from the 256-bit code on)
            lines[-1] += " Marks of another picture than the original " + (
                "; ".join(
                    f"at {name}: {len(m['wrong_marks'])}"
                    + "".join(f" ({a}, {b})" for a, b in m["wrong_marks"][:10])
                    for name, m in marks.items()
                )
                + " (test picture copied, database picture marked; the "
                "database's training pictures numbered from 10,000)."
            )
    return lines


def _cnn(settings: dict) -> str:
    """The instance code's backbone, by its width (a run that recorded no
    width had DSH's)."""
    width = settings.get("width", 1)
    return "the DSH CNN" + (f" {width} times as wide" if width > 1 else "")


def held_out_families_table(data: dict) -> list[str]:
    """Recall@1 of the code that never saw a family beside the one that did."""
    settings = data["settings"]
    if not data["results"]:
        return _reference_table(data)
    lines = [
        f"Leave one family out: recall@1 over {settings['queries']:,} CIFAR-10 "
        "test pictures altered by one family (or its group mixed), among 10,000 "
        "and 60,000 pictures; each held-out code trained without its group, the "
        f"reference on the whole family, both {settings['epochs']} epochs on "
        f"{settings['train_pictures']:,} pictures ({settings['bits']} bits), "
        f"on {cpu_of(data)}:",
        "",
    ]
    columns = [f"{who} {size}" for size in ("10k", "60k") for who in ("held out",
               "reference")]  # fmt: skip
    rows = [
        [name, row["held out group"], *(f"{row[c]['recall@1']:.3f}" for c in columns)]
        for name, row in data["results"].items()
    ]
    return lines + table(["copies", "group held out", *columns], rows)


def _reference_table(data: dict) -> list[str]:
    """A leave-one-out run without held-out codes: the reference alone."""
    settings = data["settings"]
    lines = [
        f"Recall@1 and @10 over {settings['queries']:,} CIFAR-10 test pictures "
        "altered by each family alone, by each group mixed and by the whole "
        "family, among 10,000 and 60,000 pictures; a code trained on the whole "
        f"family, {settings['epochs']} epochs on {settings['train_pictures']:,} "
        f"pictures ({settings['bits']} bits), on {_cnn(settings)}, on "
        f"{cpu_of(data)}:",
        "",
    ]
    columns = [(k, size) for size in ("10k", "60k") for k in ("recall@1", "recall@10")]
    rows = [
        [name, *(f"{row[size][k]:.3f}" for k, size in columns)]
        for name, row in data["reference"].items()
    ]
    return lines + table(["copies", *(f"{k} {size}" for k, size in columns)], rows)


# The columns of the MobileNet run's table: (query set, database, family).
_MOBILENET_COLUMNS = [
    (split, size, family)
    for split, size in (("validation", "50k"), ("test", "60k"), ("fashion", "70k"))
    for family in ("whole family", "crop")
]


def render_mobilenet_instance(data: dict) -> list[str]:
    """Recall@1 of the fine-tuned MobileNet code beside the shipped one, on
    the largest database of each query set, with the distinct codes of the
    Fashion-MNIST pictures (never trained on)."""
    settings = data["settings"]
    lines = [
        f"Recall@1 of {settings['queries']:,} copies (whole family / crops alone) "
        "among CIFAR-10's validation (50,000), test (60,000) and Fashion-MNIST's "
        "70,000 pictures; MobileNet v1 at "
        f"{settings['size']} × {settings['size']}, {settings['epochs']} epochs at a "
        f"learning rate of {settings['learning_rate']:g} on "
        f"{settings['train_pictures']:,} pictures "
        f"({_seconds(data.get('train_seconds'))} of training), on {cpu_of(data)}:",
        "",
    ]
    rows = [
        [
            code,
            *(f"{row[s][f][n]['recall@1']:.3f}" for s, n, f in _MOBILENET_COLUMNS),
            f"{row['fashion']['distinct_codes']['70k']:,}",
        ]
        for code, row in data["results"].items()
    ]
    headers = [f"{s} {n} {f}" for s, n, f in _MOBILENET_COLUMNS]
    return lines + table(["code", *headers, "distinct codes, fashion 70k"], rows)


def _seconds(value) -> str:
    return "unrecorded time" if value is None else f"{value:,.0f} s"
