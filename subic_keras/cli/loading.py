"""What several `subic` commands share: their model, and the index they
open (`commands`, `search_commands`)."""

from __future__ import annotations

from subic_keras.search import uri as search_uri
from subic_keras.serving.export import load_encoder, load_subic


def load_model(path: str, instance: bool = False):
    """The model at `path` (with `instance`, also an instance code, and the
    word `instance` for the one that ships with the package)."""
    subic = load_encoder(path) if instance else load_subic(path)
    subic.show_progress = True
    return subic


def index_name(args, uri: str) -> str:
    """How messages name the index at `uri`."""
    if search_uri.is_database(uri):
        return f"collection {args.collection!r} at {uri}"
    return f"index {uri}"


def open_index(args, uri: str):
    """The index at `uri`, and how messages name it."""
    join_ray(args, uri)
    index = search_uri.open(
        uri, collection=args.collection, scanner=getattr(args, "scanner", "auto")
    )
    return index, index_name(args, uri)


def open_pictures(args, uri: str, shards: bool = False):
    """The index of a folder's pictures at `uri` (a `PictureIndex`): a
    `.subic` file, a Milvus collection, or with `shards` a manifest.

    Raises:
        ValueError: `uri` holds codes without the pictures' paths.
    """
    from subic_keras.search.image_index import ImageIndex

    if search_uri.is_database(uri):
        from subic_keras.search.milvus_pictures import MilvusPictures

        # Refuses (and closes) a collection of codes without paths.
        return MilvusPictures(uri, args.collection)
    if not (shards and search_uri.is_manifest(uri)):
        return ImageIndex.load(uri)
    index, name = open_index(args, uri)
    if not index.holds_pictures:  # a manifest of shards of codes alone
        raise ValueError(
            f"{name} holds codes without image paths (of a dataset split, not of "
            "a folder); build one from a folder with `subic index build MODEL "
            "DIR --output URI`"
        )
    return index


def join_ray(args, uri) -> None:
    """Ray joined (or started) as `--ray-address` says, for a manifest."""
    if search_uri.is_manifest(uri):
        from subic_keras.search.ray_cluster import ray_module

        ray_module(getattr(args, "ray_address", None))
