"""Build Arctic Inference's suffix tree (and only it) into a cached wheel: `arctic-inference==0.3.0+spectune.suffix`.

PyPI's arctic-inference 0.3.0 is an sdist whose build needs CUDA-era torch ops and registers a vLLM plugin.
This script downloads that pinned sdist (sha256-checked), compiles only `csrc/suffix_decoding` (C++20, nanobind
2.9.2, about 20 s on 2 cores) and packs `arctic_inference.suffix_decoding` with its `_C` extension into a wheel
with NO entry points, so nothing registers itself into vLLM. The package name and module path are Arctic's, so
vLLM's `method: "suffix"` (which imports `arctic_inference.suffix_decoding`) finds it too.

Usage: python scripts/build_arctic_suffix.py WHEEL_DIR   (prints the wheel's path; does nothing if it exists)
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

SDIST = "arctic_inference-0.3.0.tar.gz"
SDIST_SHA256 = "7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36"
VERSION = "0.3.0+spectune.suffix"
NANOBIND = "nanobind==2.9.2"
PY_FILES = ("arctic_inference/suffix_decoding/__init__.py", "arctic_inference/suffix_decoding/cache.py")


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    print(">>", " ".join(cmd[:6]), "..." if len(cmd) > 6 else "", flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wheel_name() -> str:
    return f"arctic_inference-{VERSION}-{_tag()}.whl"


def _tag() -> str:
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"{py}-{py}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"


def _fetch_sdist(work: Path) -> Path:
    _run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--no-binary", "arctic-inference", "-d", str(work), "arctic-inference==0.3.0"]
    )
    sdist = work / SDIST
    if _sha256(sdist) != SDIST_SHA256:
        raise SystemExit(f"{SDIST}: sha256 {_sha256(sdist)} is not the pinned {SDIST_SHA256}")
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    return work / SDIST.removesuffix(".tar.gz")


def _compile(src: Path, work: Path) -> Path:
    nb = work / "nanobind"
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(nb), NANOBIND])
    cmake_dir = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path[:0] = sys.argv[1:]; import nanobind as n; print(n.cmake_dir())"]
        + [str(nb)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    build = work / "build"
    _run(
        ["cmake", "-S", str(src / "csrc" / "suffix_decoding"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"]
        + [f"-DPython_EXECUTABLE={sys.executable}", f"-Dnanobind_DIR={cmake_dir}"]
    )
    _run(["cmake", "--build", str(build), "-j", str(max(1, len(os.sched_getaffinity(0))))])
    (ext,) = build.glob("_C*.so")
    return ext


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _pack(src: Path, ext: Path, out: Path) -> None:
    dist = f"arctic_inference-{VERSION}.dist-info"
    files: dict[str, bytes] = {"arctic_inference/__init__.py": b'"""Arctic Inference: the suffix tree only."""\n'}
    for rel in PY_FILES:
        files[rel] = (src / rel).read_bytes()
    files[f"arctic_inference/suffix_decoding/{ext.name}"] = ext.read_bytes()
    files[f"{dist}/LICENSE"] = (src / "LICENSE").read_bytes()
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: arctic_inference\nVersion: {VERSION}\n"
        "Summary: Snowflake Arctic Inference's suffix decoding tree only (built by spectune; no vLLM plugin)\n"
        "License: Apache-2.0\nRequires-Dist: numpy\n"
    ).encode()
    files[f"{dist}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: spectune\nRoot-Is-Purelib: false\nTag: {_tag()}\n"
    ).encode()
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as whl:
        for name, data in files.items():
            whl.writestr(name, data)
    tmp.replace(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("wheel_dir", help="the folder the wheel is kept in (made when missing)")
    wheels = Path(parser.parse_args(argv).wheel_dir)
    if wheels.exists() and not wheels.is_dir():
        parser.error(f"{wheels}: not a folder")
    out = wheels / _wheel_name()
    if out.exists():
        print(out)
        return 0
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            print(f"!! {tool} not found: install Debian's cmake and g++ to build the suffix tree", file=sys.stderr)
            return 1
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="arctic-suffix-") as tmp:
        work = Path(tmp)
        src = _fetch_sdist(work)
        _pack(src, _compile(src, work), out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
