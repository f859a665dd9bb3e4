"""Data: dataset loaders, folders of pictures, image decoding and the
`tf.data` pipelines and streams that feed training.

A new dataset layout goes in `datasets.py` (a tensorflow-datasets one in
`tfds_loaders.py`), a new image format or decode rule in `images.py`.
"""
