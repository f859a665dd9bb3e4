"""Training SuBiC: the recipe (the backbone pre-trained as a classifier,
then SuBiC with its two entropies), its data, and its callbacks.

A new stage or schedule goes in `recipe.py` or `pretraining.py`, a new
callback in `callbacks.py`; the settings they read are in
`subic_keras.config`, and `subic train` runs them (`subic_keras.training`).
"""
