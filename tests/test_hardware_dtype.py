"""The default dtype is the one this machine runs well (issue #21, item 8): bf16 only where it is not emulated."""

from __future__ import annotations

from engine.measure.hardware import cpu_has_bf16, default_dtype, describe_hardware, machine_dtype
from engine.service.cli.main import build_parser

XEON = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"


def test_bf16_is_the_default_only_where_the_cpu_or_a_gpu_computes_it() -> None:
    assert not cpu_has_bf16(XEON) and cpu_has_bf16(SAPPHIRE) and not cpu_has_bf16("no flags line")
    assert default_dtype("cpu", False) == "float32" and default_dtype("cpu", True) == "bfloat16"
    assert default_dtype("cuda", False) == "bfloat16"


def test_the_run_page_and_the_cli_default_to_this_machines_dtype() -> None:
    from app.run_view import default_dtype as page_default

    hw = describe_hardware()
    expected = default_dtype(hw["kind"], cpu_has_bf16() if hw["kind"] == "cpu" else False)
    assert hw["default_dtype"] == expected == machine_dtype() == page_default(hw)
    for command in ("run", "submit"):
        extra = ["--json", "out.json"] if command == "run" else []
        args = build_parser().parse_args([command, "--prompts", "p.txt", *extra])
        assert args.dtype is None  # resolved to machine_dtype() when the spec is built
