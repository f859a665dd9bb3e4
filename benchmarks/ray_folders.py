"""Encoding a folder on Ray (Ray Data) against `index_folder` in one process.

`subic_keras.serving.ray_folders.index_folder_on_ray` decodes and encodes a folder
with a pool of encoder actors and writes picture shards and a manifest;
`retrieval.index_folder` does the same in one process. This measures, on
one machine, for a folder of CIFAR-10 test pictures written as PNG files
and the default CIFAR-10 model (M = 8, K = 64, untrained: speed does not
depend on the weights), in one run:

- pictures per second of `index_folder` (the model loaded already, as in
  `subic index build`), and of `index_folder_on_ray` on a local Ray
  instance (wall time, actors' start and model loading included), with
  the encoder pool its default;
- that both give every picture the same code.

    python -m benchmarks.ray_folders                      # ~3 min on 2 cores
    python -m benchmarks.ray_folders --num-pictures 500   # a quick run

Writes `benchmarks/results/ray_folders.json` with the command, CPU and
versions.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import keras

from benchmarks import common
from subic_keras.data import datasets
from subic_keras.data.images import write_image_folder
from subic_keras.search.image_index import ImageIndex
from subic_keras.serving import retrieval
from subic_keras.serving.export import load_subic
from subic_keras.serving.ray_folders import index_folder_on_ray
from subic_keras.training import TrainConfig, build_model

RESULTS = os.path.join(os.path.dirname(__file__), "results", "ray_folders.json")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-pictures", type=int, default=10_000)
    parser.add_argument("--shards", type=int, default=2)
    common.add_data_dir(parser, "cifar-10-batches-bin/")
    parser.add_argument("--output", default=RESULTS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import ray

    (x_train, _), (x_test, y_test) = datasets.load_cifar10(
        args.data_dir, max_per_split=args.num_pictures
    )
    keras.utils.set_random_seed(0)
    subic = build_model(TrainConfig(dataset="cifar10"), x_train[:200], num_classes=10)
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, "model.keras")
        subic.train_model.save(model)
        root = os.path.join(work, "pictures")
        write_image_folder(x_test, y_test, root)
        subic = load_subic(model)
        start = time.perf_counter()
        single, _ = retrieval.index_folder(subic, root, model_path=model)
        single_s = time.perf_counter() - start
        common.log(f"index_folder: {len(single) / single_s:.0f} pictures/s")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(log_to_driver=False, include_dashboard=False)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        manifest = os.path.join(work, "pictures.shards.json")
        start = time.perf_counter()
        files, report = index_folder_on_ray(model, root, manifest, args.shards)
        ray_s = time.perf_counter() - start
        ray.shutdown()
        common.log(f"index_folder_on_ray: {report.added / ray_s:.0f} pictures/s")
        codes = {}
        for file in files:
            shard = ImageIndex.load(file)
            codes.update(zip(shard.get_paths(), map(tuple, shard.get_codes())))
        want = dict(zip(single.get_paths(), map(tuple, single.get_codes())))
        same = codes == want
    result = {
        **common.run_metadata("ray_folders", "ray", "tensorflow"),
        "pictures": len(single),
        "model": "TrainConfig(dataset='cifar10') untrained (M = 8, K = 64)",
        "shards": args.shards,
        "ray_cpus": cpus,
        "encoders": max(1, cpus - 1),
        "index_folder_pictures_per_s": len(single) / single_s,
        "ray_pictures_per_s": report.added / ray_s,
        "ray_over_index_folder": (report.added / ray_s) / (len(single) / single_s),
        "same_codes": same,
    }
    common.write_json(args.output, result)
    print(
        f"{len(single):,} pictures: index_folder {len(single) / single_s:.0f}/s, "
        f"Ray Data ({result['encoders']} encoder of {cpus} CPUs, {args.shards} "
        f"shards) {report.added / ray_s:.0f}/s "
        f"({result['ray_over_index_folder']:.2f}x); same codes: {same}"
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
