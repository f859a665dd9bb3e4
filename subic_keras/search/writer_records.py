"""What an index file records of who wrote it: the model, and the shard.

`SubicIndex` keeps both and saves them in its file's metadata (`file_format`
version 3 on); an `ImageIndex` keeps them in its codes. The model record
(`retrieval.model_record`) lets the model that searches an index be checked
against the one that wrote it; the shard label lets a shard's actor refuse a
file put in its place (`manifests.check_label`).
"""

from __future__ import annotations

from subic_keras.search.checks import check_model_record, check_shard_label


class WriterRecords:
    """The model and shard label of an index, read from and written to its
    file's metadata."""

    _model: dict | None = None
    _shard: tuple[str, int] | None = None

    @property
    def model(self) -> dict | None:
        """The model that wrote the codes (`retrieval.model_record`), saved
        with the index and checked against the model that searches it; None
        when unknown (an index written by an earlier version)."""
        return self._model

    @model.setter
    def model(self, record: dict | None) -> None:
        self._model = check_model_record("model", record)

    @property
    def shard_label(self) -> tuple[str, int] | None:
        """`(build, number)`: the shard of a manifest's build this file is
        (`manifests`), saved with it so that a shard's actor refuses a file
        put in its place; None for an index of its own."""
        return self._shard

    @shard_label.setter
    def shard_label(self, label) -> None:
        self._shard = check_shard_label("shard_label", label)

    def file_metadata(self) -> dict:
        """What a file of this index records of its writer (where known)."""
        metadata: dict = {} if self._model is None else {"model": self._model}
        if self._shard is not None:
            metadata["shard"] = list(self._shard)
        return metadata

    def read_records(self, metadata: dict) -> None:
        """Takes the model and shard label of a file's `metadata`.

        Raises:
            ValueError: for either malformed.
        """
        self.model = metadata.get("model")
        self.shard_label = metadata.get("shard")
