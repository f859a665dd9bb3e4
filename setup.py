"""Packaging for subic-keras."""

from setuptools import Extension, find_packages, setup

with open("README.md", encoding="utf-8") as handle:
    long_description = handle.read()

setup(
    name="subic-keras",
    version="0.1.0",
    description="SuBiC supervised structured binary codes for image search, in Keras 3",
    long_description=long_description,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["subic_keras", "subic_keras.*"]),
    # PEP 561: the package's type hints are visible to users' type checkers.
    package_data={"subic_keras": ["py.typed", "static/*.html", "pretrained/*.keras"]},
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.16",
        "keras>=3.3",
        "numpy>=1.26",
        "scikit-learn>=1.3",
        "tensorflow-datasets>=4.9",
        # tensorflow-datasets' file access (etils.epath) imports it, but
        # tensorflow-datasets does not declare it.
        "importlib_resources>=5",
        "faiss-cpu>=1.8",
        "tqdm>=4.60",
        "tensorboard>=2.16",
        # Decoding the pictures of a folder, a query file or an upload.
        "pillow>=10",
        # `subic serve`: the REST API and the web page.
        "fastapi>=0.110",
        "uvicorn>=0.29",
        "python-multipart>=0.0.9",
    ],
    extras_require={
        "litert": ["ai-edge-litert>=1.0"],
        # subic_keras.search.milvus: Milvus Lite (embedded) and Milvus servers.
        # The lowest versions tested: milvus-lite 2.4.12 fails on collection
        # properties (UNIMPLEMENTED), 2.5.1 on the first insert.
        "milvus": ["pymilvus>=3.0.2", "milvus-lite>=3.2.2"],
        # subic_keras.search.ray_index: shards in Ray actors (2.60 tested).
        "ray": ["ray>=2.60"],
        # benchmarks/near_duplicates.py: ImageHash's perceptual hashes, a peer.
        "benchmarks": ["imagehash>=4.3"],
        "notebooks": [
            "nbconvert>=7",  # `jupyter nbconvert --execute`, as tutorials/README.md
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6",
            "matplotlib>=3.7",
        ],
        "test": [
            "pytest>=7.4",
            "pytest-xdist>=3.5",  # the README's `-n 2`: two workers on 2 cores
            "pytest-timeout>=2.3",  # a test that hangs fails (pyproject.toml)
            "ruff>=0.5",
            "mypy>=1.10",  # .ci/run type-checks subic_keras (pyproject.toml)
            "ai-edge-litert>=1.0",
            "pymilvus>=3.0.2",
            "milvus-lite>=3.2.2",
            "ray>=2.60",
            "nbconvert>=7",  # tutorials/README.md's command, run by the tests
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6",
            "matplotlib>=3.7",
            "httpx>=0.27",  # FastAPI's TestClient
            "playwright>=1.40",  # the web page in Debian's chromium
        ],
    },
    # The exact SIMD scan (subic_keras/search/native.py). Optional: without a C
    # compiler the package installs anyway and faiss's engines search.
    ext_modules=[
        Extension(
            "subic_keras.search._scan",
            ["subic_keras/search/_scan.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        )
    ],
    entry_points={"console_scripts": ["subic=subic_keras.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
